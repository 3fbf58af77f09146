/*
 * tiermem's YCSB binding for memcached (Debian's memcached, or any server of memcached's text
 * protocol), over one plain TCP connection per client thread.
 *
 * YCSB 0.17.0's own memcached binding is not published to Maven Central, and it replaces a
 * record with only the updated fields on an update (so a read after it misses the others and
 * dataintegrity=true cannot hold). Here:
 *   - a record is one item: its fields encoded as (u16 name length, name, u32 value length,
 *     value) in field order;
 *   - read = get; insert = set; update = get, merge the new fields in, set (two round trips,
 *     like a read-modify-write application; a record missing is NOT_FOUND); delete = delete;
 *   - scan is NOT_IMPLEMENTED (memcached has no ordered keys).
 *
 * Commands sent: get, set (flags 0, no expiry), delete. Nothing else.
 *
 * Properties: memcached.host (default localhost), memcached.port (default 11211),
 * memcached.timeout (connect and socket timeout in milliseconds, default 2000).
 */
package tiermem.ycsb;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.ByteArrayOutputStream;
import java.io.DataOutputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.Vector;

import site.ycsb.ByteArrayByteIterator;
import site.ycsb.ByteIterator;
import site.ycsb.DB;
import site.ycsb.DBException;
import site.ycsb.Status;

/** A YCSB {@link DB} over one memcached text-protocol connection per client thread. */
public class MemcachedClient extends DB {
  /** Server host name or address. */
  public static final String HOST_PROPERTY = "memcached.host";
  /** Server TCP port. */
  public static final String PORT_PROPERTY = "memcached.port";
  /** Connect and socket timeout, milliseconds. */
  public static final String TIMEOUT_PROPERTY = "memcached.timeout";

  private Socket socket;
  private InputStream in;
  private OutputStream out;

  @Override
  public void init() throws DBException {
    Properties p = getProperties();
    String host = p.getProperty(HOST_PROPERTY, "localhost");
    int port;
    int timeout;
    try {
      port = Integer.parseInt(p.getProperty(PORT_PROPERTY, "11211"));
      timeout = Integer.parseInt(p.getProperty(TIMEOUT_PROPERTY, "2000"));
    } catch (NumberFormatException e) {
      throw new DBException("bad " + PORT_PROPERTY + " or " + TIMEOUT_PROPERTY + ": " + e.getMessage());
    }
    try {
      socket = new Socket();
      socket.setTcpNoDelay(true);
      socket.connect(new InetSocketAddress(host, port), timeout);
      socket.setSoTimeout(timeout);
      in = new BufferedInputStream(socket.getInputStream(), 65536);
      out = new BufferedOutputStream(socket.getOutputStream(), 65536);
    } catch (IOException e) {
      throw new DBException("cannot connect to " + host + ":" + port + ": " + e.getMessage(), e);
    }
  }

  @Override
  public void cleanup() throws DBException {
    try {
      if (socket != null) {
        socket.close();
      }
    } catch (IOException e) {
      throw new DBException(e);
    }
  }

  private static byte[] bytes(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  /** Reads one protocol line (without its CRLF). */
  private String readLine() throws IOException {
    ByteArrayOutputStream b = new ByteArrayOutputStream(64);
    while (true) {
      int c = in.read();
      if (c < 0) {
        throw new EOFException("memcached closed the connection");
      }
      if (c == '\r') {
        int n = in.read();
        if (n != '\n') {
          throw new IOException("malformed line from memcached");
        }
        return new String(b.toByteArray(), StandardCharsets.UTF_8);
      }
      b.write(c);
    }
  }

  private void readFully(byte[] buf) throws IOException {
    int off = 0;
    while (off < buf.length) {
      int n = in.read(buf, off, buf.length - off);
      if (n < 0) {
        throw new EOFException("memcached closed the connection");
      }
      off += n;
    }
  }

  /** The item of key, or null when memcached has none. */
  private byte[] get(String key) throws IOException {
    out.write(bytes("get " + key + "\r\n"));
    out.flush();
    String l = readLine();
    if (l.equals("END")) {
      return null;
    }
    String[] f = l.split(" ");
    if (f.length < 4 || !f[0].equals("VALUE") || !f[1].equals(key)) {
      throw new IOException("unexpected reply to get: " + l);
    }
    byte[] data = new byte[Integer.parseInt(f[3])];
    readFully(data);
    byte[] crlf = new byte[2];
    readFully(crlf);
    String end = readLine();
    if (!end.equals("END")) {
      throw new IOException("unexpected end of get: " + end);
    }
    return data;
  }

  /** Stores data under key; false when memcached did not store it. */
  private boolean set(String key, byte[] data) throws IOException {
    out.write(bytes("set " + key + " 0 0 " + data.length + "\r\n"));
    out.write(data);
    out.write(bytes("\r\n"));
    out.flush();
    String l = readLine();
    if (l.equals("STORED")) {
      return true;
    }
    if (l.equals("NOT_STORED") || l.startsWith("SERVER_ERROR")) {
      return false;
    }
    throw new IOException("unexpected reply to set: " + l);
  }

  private static byte[] encode(Map<String, byte[]> fields) throws IOException {
    ByteArrayOutputStream b = new ByteArrayOutputStream(1200);
    DataOutputStream d = new DataOutputStream(b);
    for (Map.Entry<String, byte[]> e : fields.entrySet()) {
      byte[] name = bytes(e.getKey());
      d.writeShort(name.length);
      d.write(name);
      d.writeInt(e.getValue().length);
      d.write(e.getValue());
    }
    d.flush();
    return b.toByteArray();
  }

  private static LinkedHashMap<String, byte[]> decode(byte[] data) throws IOException {
    LinkedHashMap<String, byte[]> m = new LinkedHashMap<>();
    ByteBuffer b = ByteBuffer.wrap(data);
    try {
      while (b.hasRemaining()) {
        byte[] name = new byte[b.getShort() & 0xffff];
        b.get(name);
        int n = b.getInt();
        if (n < 0 || n > b.remaining()) {
          throw new IOException("corrupt record");
        }
        byte[] v = new byte[n];
        b.get(v);
        m.put(new String(name, StandardCharsets.UTF_8), v);
      }
    } catch (java.nio.BufferUnderflowException e) {
      throw new IOException("corrupt record", e);
    }
    return m;
  }

  private static LinkedHashMap<String, byte[]> plain(Map<String, ByteIterator> values) {
    LinkedHashMap<String, byte[]> m = new LinkedHashMap<>();
    for (Map.Entry<String, ByteIterator> e : values.entrySet()) {
      m.put(e.getKey(), e.getValue().toArray());
    }
    return m;
  }

  @Override
  public Status read(String table, String key, Set<String> fields, Map<String, ByteIterator> result) {
    try {
      byte[] data = get(key);
      if (data == null) {
        return Status.NOT_FOUND;
      }
      for (Map.Entry<String, byte[]> e : decode(data).entrySet()) {
        if (fields == null || fields.contains(e.getKey())) {
          result.put(e.getKey(), new ByteArrayByteIterator(e.getValue()));
        }
      }
      return Status.OK;
    } catch (IOException e) {
      return Status.ERROR;
    }
  }

  @Override
  public Status scan(String table, String startkey, int recordcount, Set<String> fields,
      Vector<HashMap<String, ByteIterator>> result) {
    return Status.NOT_IMPLEMENTED;
  }

  @Override
  public Status update(String table, String key, Map<String, ByteIterator> values) {
    try {
      byte[] data = get(key);
      if (data == null) {
        return Status.NOT_FOUND;
      }
      LinkedHashMap<String, byte[]> m = decode(data);
      m.putAll(plain(values));
      return set(key, encode(m)) ? Status.OK : Status.ERROR;
    } catch (IOException e) {
      return Status.ERROR;
    }
  }

  @Override
  public Status insert(String table, String key, Map<String, ByteIterator> values) {
    try {
      return set(key, encode(plain(values))) ? Status.OK : Status.ERROR;
    } catch (IOException e) {
      return Status.ERROR;
    }
  }

  @Override
  public Status delete(String table, String key) {
    try {
      out.write(bytes("delete " + key + "\r\n"));
      out.flush();
      String l = readLine();
      if (l.equals("DELETED")) {
        return Status.OK;
      }
      if (l.equals("NOT_FOUND")) {
        return Status.NOT_FOUND;
      }
      return Status.ERROR;
    } catch (IOException e) {
      return Status.ERROR;
    }
  }
}
