//! Being written (see docs/migrate.md).
