/*
 * tiermem's YCSB binding for any Redis-protocol (RESP) server: tiermem-kv and redis-server.
 *
 * Data model (the same as YCSB's own redis binding, so that results compare with published
 * YCSB-on-Redis numbers):
 *   - a record is a hash: key -> {field0: value, ..., field9: value};
 *   - every inserted key is also a member of the sorted set "_indices", scored by the key's
 *     String.hashCode(), so that a scan is ZRANGEBYSCORE _indices hash(startkey) +inf LIMIT 0 n
 *     followed by a read of each key found.
 *
 * Commands sent: HMSET, HGETALL (read of all fields), HMGET (read of chosen fields), DEL, ZADD,
 * ZREM, ZRANGEBYSCORE ... LIMIT. Nothing else: no HELLO, no CLIENT SETNAME/SETINFO, no AUTH,
 * no SELECT (YCSB's table name is ignored, as YCSB's redis binding does).
 *
 * Properties: redis.host (default localhost), redis.port (default 6379), redis.timeout
 * (connect and socket timeout in milliseconds, default 2000).
 */
package tiermem.ycsb;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.Vector;

import redis.clients.jedis.ClientSetInfoConfig;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.Jedis;
import redis.clients.jedis.exceptions.JedisException;
import site.ycsb.ByteArrayByteIterator;
import site.ycsb.ByteIterator;
import site.ycsb.DB;
import site.ycsb.DBException;
import site.ycsb.Status;

/** A YCSB {@link DB} over one Jedis connection per client thread (YCSB makes one DB per thread). */
public class RespClient extends DB {
  /** Server host name or address. */
  public static final String HOST_PROPERTY = "redis.host";
  /** Server TCP port. */
  public static final String PORT_PROPERTY = "redis.port";
  /** Connect and socket timeout, milliseconds. */
  public static final String TIMEOUT_PROPERTY = "redis.timeout";
  /** The sorted set that indexes every inserted key, for scans. */
  public static final String INDEX_KEY = "_indices";

  private static final byte[] INDEX_KEY_BYTES = bytes(INDEX_KEY);

  private Jedis jedis;

  @Override
  public void init() throws DBException {
    Properties p = getProperties();
    String host = p.getProperty(HOST_PROPERTY, "localhost");
    int port;
    int timeout;
    try {
      port = Integer.parseInt(p.getProperty(PORT_PROPERTY, "6379"));
      timeout = Integer.parseInt(p.getProperty(TIMEOUT_PROPERTY, "2000"));
    } catch (NumberFormatException e) {
      throw new DBException("bad " + PORT_PROPERTY + " or " + TIMEOUT_PROPERTY + ": " + e.getMessage());
    }
    DefaultJedisClientConfig config = DefaultJedisClientConfig.builder()
        .connectionTimeoutMillis(timeout)
        .socketTimeoutMillis(timeout)
        .clientSetInfoConfig(ClientSetInfoConfig.DISABLED)
        .build();
    try {
      jedis = new Jedis(new HostAndPort(host, port), config);
      jedis.connect();
    } catch (JedisException e) {
      throw new DBException("cannot connect to " + host + ":" + port + ": " + e.getMessage(), e);
    }
  }

  @Override
  public void cleanup() throws DBException {
    if (jedis != null) {
      try {
        jedis.close();
      } catch (JedisException e) {
        throw new DBException("closing the connection: " + e.getMessage(), e);
      }
    }
  }

  /** The index score of a key: fast and spread over the doubles; only its order matters. */
  static double score(String key) {
    return key.hashCode();
  }

  @Override
  public Status read(String table, String key, Set<String> fields, Map<String, ByteIterator> result) {
    try {
      return readInto(bytes(key), fields, result);
    } catch (JedisException e) {
      return Status.ERROR;
    }
  }

  private Status readInto(byte[] key, Set<String> fields, Map<String, ByteIterator> result) {
    if (fields == null) {
      for (Map.Entry<byte[], byte[]> e : jedis.hgetAll(key).entrySet()) {
        result.put(string(e.getKey()), new ByteArrayByteIterator(e.getValue()));
      }
    } else {
      List<String> names = new ArrayList<>(fields);
      byte[][] wanted = new byte[names.size()][];
      for (int i = 0; i < wanted.length; i++) {
        wanted[i] = bytes(names.get(i));
      }
      Iterator<byte[]> values = jedis.hmget(key, wanted).iterator();
      for (String name : names) {
        byte[] v = values.hasNext() ? values.next() : null;
        if (v != null) {
          result.put(name, new ByteArrayByteIterator(v));
        }
      }
    }
    return result.isEmpty() ? Status.NOT_FOUND : Status.OK;
  }

  @Override
  public Status scan(String table, String startkey, int recordcount, Set<String> fields,
      Vector<HashMap<String, ByteIterator>> result) {
    try {
      List<String> keys = jedis.zrangeByScore(INDEX_KEY, score(startkey), Double.POSITIVE_INFINITY,
          0, recordcount);
      for (String k : keys) {
        HashMap<String, ByteIterator> row = new HashMap<>();
        readInto(bytes(k), fields, row);
        result.add(row);
      }
      return Status.OK;
    } catch (JedisException e) {
      return Status.ERROR;
    }
  }

  @Override
  public Status update(String table, String key, Map<String, ByteIterator> values) {
    try {
      return "OK".equals(jedis.hmset(bytes(key), hash(values))) ? Status.OK : Status.ERROR;
    } catch (JedisException e) {
      return Status.ERROR;
    }
  }

  @Override
  public Status insert(String table, String key, Map<String, ByteIterator> values) {
    try {
      byte[] k = bytes(key);
      if (!"OK".equals(jedis.hmset(k, hash(values)))) {
        return Status.ERROR;
      }
      jedis.zadd(INDEX_KEY_BYTES, score(key), k);
      return Status.OK;
    } catch (JedisException e) {
      return Status.ERROR;
    }
  }

  @Override
  public Status delete(String table, String key) {
    try {
      byte[] k = bytes(key);
      long removed = jedis.del(k) + jedis.zrem(INDEX_KEY_BYTES, k);
      return removed == 0 ? Status.NOT_FOUND : Status.OK;
    } catch (JedisException e) {
      return Status.ERROR;
    }
  }

  private static Map<byte[], byte[]> hash(Map<String, ByteIterator> values) {
    Map<byte[], byte[]> h = new HashMap<>(values.size() * 2);
    for (Map.Entry<String, ByteIterator> e : values.entrySet()) {
      h.put(bytes(e.getKey()), e.getValue().toArray());
    }
    return h;
  }

  private static byte[] bytes(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  private static String string(byte[] b) {
    return new String(b, StandardCharsets.UTF_8);
  }
}
