//! RESP2: request parsing (multibulk and inline) and reply encoding. Being written.
