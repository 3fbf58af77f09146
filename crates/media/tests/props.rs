//! Property tests: delay-model Display/FromStr round trip, non-temporal copy correctness.

use proptest::prelude::*;
use tiermem_media::{nt_copy, DelayModel};

fn latency() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        1u64..5_000,
        (1u64..5_000).prop_map(|x| x * 1_000),
        (1u64..100).prop_map(|x| x * 1_000_000),
        any::<u32>().prop_map(u64::from)
    ]
}

fn bandwidth() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        (1u64..100).prop_map(|x| x * 1_000_000_000),
        (1u64..100).prop_map(|x| x << 30),
        (1u64..10_000).prop_map(|x| x * 1_000_000),
        1u64..u64::MAX / 2,
    ]
}

proptest! {
    #[test]
    fn delay_model_display_round_trips(r in latency(), w in latency(), rb in bandwidth(), wb in bandwidth()) {
        let m = DelayModel { read_latency_ns: r, write_latency_ns: w, read_bytes_per_sec: rb, write_bytes_per_sec: wb };
        let s = m.to_string();
        let back: DelayModel = s.parse().map_err(|e| TestCaseError::fail(format!("{s:?}: {e}")))?;
        prop_assert_eq!(back, m, "via {:?}", s);
    }

    #[test]
    fn delay_is_latency_plus_transfer(r in latency(), rb in 1u64..100_000_000_000, bytes in 0u64..(1 << 30)) {
        let m = DelayModel { read_latency_ns: r, read_bytes_per_sec: rb, ..DelayModel::NONE };
        let exact = r as f64 + bytes as f64 * 1e9 / rb as f64;
        let got = m.read_delay_ns(bytes) as f64;
        prop_assert!((got - exact).abs() <= 0.5 + exact * 1e-12, "got {} exact {}", got, exact);
        prop_assert_eq!(m.write_delay_ns(bytes), 0);
    }

    #[test]
    fn nt_copy_is_exact_for_any_alignment(dst_off in 0usize..64, src_off in 0usize..64, len in 0usize..1200, seed in any::<u8>()) {
        let src: Vec<u8> = (0..src_off + len).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed)).collect();
        let mut dst = vec![0xEEu8; dst_off + len + 64];
        // SAFETY: dst has room for len bytes at dst_off; src has len bytes at src_off; distinct Vecs.
        unsafe { nt_copy(dst.as_mut_ptr().add(dst_off), src.as_ptr().add(src_off), len) };
        prop_assert_eq!(&dst[dst_off..dst_off + len], &src[src_off..]);
        prop_assert!(dst[..dst_off].iter().all(|&b| b == 0xEE));
        prop_assert!(dst[dst_off + len..].iter().all(|&b| b == 0xEE));
    }
}

#[test]
fn nt_copy_exhaustive_small() {
    let src: Vec<u8> = (0..700u32).map(|i| (i * 31 + 5) as u8).collect();
    for dst_off in 0..64 {
        for len in (0..300).chain([511, 512, 513, 640, 641]) {
            let mut dst = vec![0u8; 64 + 700];
            // SAFETY: dst_off + len <= 64 + 641 < dst.len(); len <= src.len().
            unsafe { nt_copy(dst.as_mut_ptr().add(dst_off), src.as_ptr(), len) };
            assert_eq!(
                &dst[dst_off..dst_off + len],
                &src[..len],
                "dst_off {dst_off} len {len}"
            );
            assert!(
                dst[dst_off + len..].iter().all(|&b| b == 0),
                "overrun at dst_off {dst_off} len {len}"
            );
            assert!(
                dst[..dst_off].iter().all(|&b| b == 0),
                "underrun at dst_off {dst_off} len {len}"
            );
        }
    }
}
