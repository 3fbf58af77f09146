//! `tiermem snapshot info|verify|rm` on a file the library wrote, and on damaged copies.

use std::process::Command;
use tiermem_snapshot::{begin, Memory, Options};

fn tiermem() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tiermem"))
}

#[test]
fn info_verify_and_rm_read_a_snapshot_and_name_what_is_wrong_with_a_damaged_one() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("s.snap");
    let m = Memory::map("heap", 1 << 20).unwrap();
    for p in (0..256).step_by(2) {
        // SAFETY: inside the mapping.
        unsafe { m.as_ptr().add(p * 4096).write_volatile(p as u8 + 1) };
    }
    begin(&[&m], &target, b"app".to_vec(), Options::default())
        .unwrap()
        .wait()
        .unwrap();

    let out = tiermem()
        .args(["snapshot", "info", "--json"])
        .arg(&target)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["method"], "wp");
    assert_eq!(v["present_pages"], 128);
    assert_eq!(v["regions"][0]["name"], "heap");
    assert_eq!(v["app_state_bytes"], 3);

    let ok = tiermem()
        .args(["snapshot", "verify"])
        .arg(&target)
        .output()
        .unwrap();
    assert!(ok.status.success());

    // One flipped byte in the stored pages: verify names the unit's CRC.
    let mut bytes = std::fs::read(&target).unwrap();
    let bad = dir.path().join("bad.snap");
    bytes[3 * 4096 + 10] ^= 1;
    std::fs::write(&bad, &bytes).unwrap();
    let out = tiermem()
        .args(["snapshot", "verify"])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("CRC of unit 0"), "{err}");

    // rm refuses what is not a snapshot, unless forced.
    let junk = dir.path().join("junk");
    std::fs::write(&junk, b"not a snapshot").unwrap();
    assert!(!tiermem()
        .args(["snapshot", "rm"])
        .arg(&junk)
        .status()
        .unwrap()
        .success());
    assert!(junk.exists());
    assert!(tiermem()
        .args(["snapshot", "rm", "--force"])
        .arg(&junk)
        .status()
        .unwrap()
        .success());
    assert!(tiermem()
        .args(["snapshot", "rm"])
        .arg(&target)
        .status()
        .unwrap()
        .success());
    assert!(!target.exists());
}
