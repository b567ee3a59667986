use super::*;

const ID: SenderId = SenderId { incarnation: 1_000, salt: 42 };

fn key(b: u8) -> ClusterKey {
    ClusterKey::new([b; KEY_LEN])
}

fn datagram(sealer: &mut Sealer, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0; HEADER_LEN + payload.len() + TAG_LEN];
    buf[HEADER_LEN..HEADER_LEN + payload.len()].copy_from_slice(payload);
    let n = sealer.seal(&mut buf, payload.len()).unwrap();
    buf.truncate(n);
    buf
}

#[test]
fn round_trip_encrypts_and_authenticates() {
    let mut sealer = Sealer::new(&key(7), ID);
    let mut opener = Opener::new(key(7));
    for i in 0..5u8 {
        let payload = vec![i; 1400];
        let mut d = datagram(&mut sealer, &payload);
        assert_eq!(d.len(), payload.len() + OVERHEAD);
        assert_ne!(&d[HEADER_LEN..HEADER_LEN + 1400], &payload[..], "the payload travels encrypted");
        let range = opener.open(&mut d).unwrap();
        assert_eq!(&d[range], &payload[..]);
    }
}

#[test]
fn forged_corrupted_and_foreign_datagrams_fail_authentication() {
    let mut sealer = Sealer::new(&key(7), ID);
    let good = datagram(&mut sealer, b"hello pod");
    let mut opener = Opener::new(key(7));
    for i in 0..good.len() {
        let mut d = good.clone();
        d[i] ^= 0x01;
        let r = opener.open(&mut d);
        assert!(matches!(r, Err(Refused::Auth | Refused::Malformed)), "flipped byte {i}: {r:?}");
    }
    let mut other = Sealer::new(&key(8), ID);
    assert_eq!(Opener::new(key(7)).open(&mut datagram(&mut other, b"x")), Err(Refused::Auth));
    // The original still opens: nothing above disturbed the state.
    assert!(opener.open(&mut good.clone()).is_ok());
}

#[test]
fn garbage_is_malformed() {
    let mut opener = Opener::new(key(1));
    for mut d in [vec![], vec![0; 10], vec![0xff; 100], b"HK\x03\x01".repeat(20), b"HK\x02\x09".repeat(20)] {
        assert_eq!(opener.open(&mut d), Err(Refused::Malformed));
    }
    // A version 1 datagram (one whole message, before chunks) is of no known format either.
    let mut v1 = datagram(&mut Sealer::new(&key(1), ID), b"old");
    v1[2] = 1;
    assert_eq!(opener.open(&mut v1), Err(Refused::Malformed));
}

#[test]
fn replays_are_refused_and_reordering_is_tolerated() {
    let mut sealer = Sealer::new(&key(3), ID);
    let ds: Vec<Vec<u8>> = (0..2000).map(|i| datagram(&mut sealer, &[i as u8; 64])).collect();
    let mut opener = Opener::new(key(3));
    assert!(opener.open(&mut ds[5].clone()).is_ok());
    assert!(opener.open(&mut ds[3].clone()).is_ok(), "late but inside the window");
    assert_eq!(opener.open(&mut ds[5].clone()), Err(Refused::Replay));
    assert_eq!(opener.open(&mut ds[3].clone()), Err(Refused::Replay));
    assert!(opener.open(&mut ds[1500].clone()).is_ok());
    assert_eq!(opener.open(&mut ds[4].clone()), Err(Refused::Replay), "fell out of the window");
    assert!(opener.open(&mut ds[1500 - WINDOW as usize + 1].clone()).is_ok(), "the window's oldest slot");
}

#[test]
fn a_restarted_peer_is_accepted_and_its_old_run_is_not() {
    let mut old = Sealer::new(&key(3), ID);
    let old_d = datagram(&mut old, b"old");
    let mut new = Sealer::new(&key(3), SenderId { incarnation: 2_000, salt: 9 });
    let mut opener = Opener::new(key(3));
    assert!(opener.open(&mut old_d.clone()).is_ok());
    assert!(opener.open(&mut datagram(&mut new, b"new")).is_ok());
    assert_eq!(opener.open(&mut datagram(&mut old, b"old again")), Err(Refused::Replay));
    assert!(opener.open(&mut datagram(&mut new, b"new again")).is_ok());
}

#[test]
fn key_text() {
    let k = ClusterKey::parse(&format!("  {}\n", "ab".repeat(32))).unwrap();
    assert_eq!(ClusterKey::parse(&k.to_text()).unwrap().0, [0xab; KEY_LEN]);
    for bad in ["", "abc", &"ab".repeat(31), &"zz".repeat(32), &"ab".repeat(33)] {
        assert!(ClusterKey::parse(bad).is_err(), "{bad}");
    }
    assert_eq!(format!("{k:?}"), "ClusterKey(..)", "never printed");
}
