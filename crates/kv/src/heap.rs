//! The storage interface: a transactional heap addressed by offsets. Being written.
