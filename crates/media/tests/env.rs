//! Environment configuration (TIERMEM_DELAY, TIERMEM_DIR). One test in its own binary, because
//! the environment is process-wide.

use tiermem_media::{
    default_dir, DelayModel, MediaError, OpenOptions, Pool, PoolOptions, SsdDevice,
};

#[test]
fn environment_sets_default_delay_and_directory() {
    let d = tempfile::Builder::new()
        .prefix("tiermem-env")
        .tempdir_in("/dev/shm")
        .unwrap();
    std::env::remove_var("TIERMEM_DELAY");
    std::env::remove_var("TIERMEM_DIR");
    // The shared directory, unless this user cannot write it (a normal user, root created it).
    let shared = std::path::PathBuf::from("/dev/shm/tiermem");
    assert!(
        default_dir() == shared || default_dir() == tiermem_media::user_dir(),
        "{}",
        default_dir().display()
    );
    assert_eq!(DelayModel::from_env().unwrap(), DelayModel::NONE);

    std::env::set_var("TIERMEM_DIR", d.path());
    assert_eq!(default_dir(), d.path());
    assert_eq!(tiermem_media::ensure_default_dir().unwrap(), d.path());

    std::env::set_var("TIERMEM_DELAY", "nvmm");
    let p = Pool::create(d.path().join("a"), &PoolOptions::new(64 << 10)).unwrap();
    assert_eq!(p.delay(), DelayModel::NVMM);
    // An explicit model wins over the environment.
    let p2 = Pool::open(
        d.path().join("a"),
        &OpenOptions::default().delay(DelayModel::NONE),
    )
    .unwrap();
    assert!(p2.delay().is_none());
    let s = SsdDevice::create(d.path().join("ssd"), 4096).unwrap();
    assert_eq!(s.delay(), DelayModel::NVMM);

    std::env::set_var("TIERMEM_DELAY", "read=fast");
    match Pool::open(d.path().join("a"), &OpenOptions::default()) {
        Err(MediaError::InvalidDelayModel { input, .. }) => assert_eq!(input, "read=fast"),
        other => panic!("a bad TIERMEM_DELAY must be an error, got {other:?}"),
    }
    std::env::remove_var("TIERMEM_DELAY");
    std::env::remove_var("TIERMEM_DIR");
}
