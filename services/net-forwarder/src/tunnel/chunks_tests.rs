use super::*;

const MTU: u32 = 1500;

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([10, 251, 2, 1], port))
}

fn message(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// The datagrams a sender produces for `msg`.
fn cut(cutter: &Cutter, id: u32, msg: &[u8]) -> Vec<Vec<u8>> {
    let count = cutter.count(msg.len());
    (0..count)
        .map(|i| {
            let mut d = cutter.header(id, i, count).to_vec();
            d.extend_from_slice(cutter.piece(msg, i));
            d
        })
        .collect()
}

/// Feeds datagrams in order; returns the messages completed.
fn feed(r: &mut Reassembly, from: SocketAddr, trusted: bool, ds: &[Vec<u8>]) -> Vec<Vec<u8>> {
    ds.iter().filter_map(|d| r.add(from, trusted, &parse(d).expect("parses")).expect("accepted")).collect()
}

#[test]
fn chunks_fit_the_link_and_all_but_the_last_are_equal() {
    let cutter = Cutter::new(MTU).unwrap();
    assert_eq!(cutter.segment() + IP_UDP_HEADERS, 1500);
    assert_eq!(cutter.per_send(), 44);
    let msg = message(65_268, 1);
    let ds = cut(&cutter, 7, &msg);
    assert_eq!(ds.len(), 45);
    assert!(ds[..44].iter().all(|d| d.len() == cutter.segment()));
    assert!(ds[44].len() <= cutter.segment());
    assert_eq!(Cutter::new(575), None);
    assert_eq!(Cutter::new(65_536), None);
    // The smallest MTU still counts its chunks in one byte.
    let small = Cutter::new(576).unwrap();
    assert!(small.count(MAX_MESSAGE) <= 255);
    assert!(Cutter::new(65_535).unwrap().per_send() >= 1);
}

#[test]
fn in_order_out_of_order_and_single_chunk_messages_reassemble() {
    let cutter = Cutter::new(MTU).unwrap();
    let mut r = Reassembly::new();
    for len in [1, 100, cutter.stride(), cutter.stride() + 1, 30_000, MAX_MESSAGE] {
        let msg = message(len, len as u8);
        let ds = cut(&cutter, len as u32, &msg);
        assert_eq!(feed(&mut r, addr(1), true, &ds), std::slice::from_ref(&msg), "in order, {len} bytes");
        let mut shuffled = cut(&cutter, len as u32 + 1_000_000, &msg);
        shuffled.reverse();
        let third = shuffled.len() / 3;
        shuffled.rotate_left(third);
        assert_eq!(feed(&mut r, addr(1), true, &shuffled), [msg], "out of order, {len} bytes");
    }
    assert_eq!(r.in_progress(), 0);
    assert_eq!(r.take_evicted(), 0);
}

#[test]
fn interleaved_messages_and_sources_do_not_mix() {
    let cutter = Cutter::new(MTU).unwrap();
    let mut r = Reassembly::new();
    let (a, b) = (message(5_000, 1), message(7_000, 2));
    let (da, db) = (cut(&cutter, 1, &a), cut(&cutter, 1, &b));
    let mut done = Vec::new();
    for (i, d) in db.iter().enumerate() {
        if let Some(d) = da.get(i) {
            done.extend(feed(&mut r, addr(1), true, std::slice::from_ref(d)));
        }
        done.extend(feed(&mut r, addr(2), true, std::slice::from_ref(d)));
    }
    assert_eq!(done, [a, b]);
}

#[test]
fn a_duplicate_chunk_is_ignored_before_and_after_completion() {
    let cutter = Cutter::new(MTU).unwrap();
    let mut r = Reassembly::new();
    let msg = message(4_000, 3);
    let ds = cut(&cutter, 9, &msg);
    let with_dups = [ds[0].clone(), ds[0].clone(), ds[1].clone(), ds[1].clone(), ds[2].clone()];
    assert_eq!(feed(&mut r, addr(1), true, &with_dups), [msg]);
    assert!(feed(&mut r, addr(1), true, &ds[1..2]).is_empty(), "a late duplicate starts nothing");
    assert_eq!(r.in_progress(), 0);
}

#[test]
fn a_message_missing_a_chunk_is_evicted_and_counted() {
    let cutter = Cutter::new(MTU).unwrap();
    let mut r = Reassembly::new();
    let lost = cut(&cutter, 1, &message(10_000, 4));
    assert!(feed(&mut r, addr(1), true, &[&lost[..3], &lost[4..]].concat()).is_empty());
    assert_eq!(r.in_progress(), 1);
    // Later messages from the same sender push it out once the sender's slots are taken.
    for id in 2..2 + SLOTS_PER_SOURCE as u32 {
        let ds = cut(&cutter, id, &message(3_000, id as u8));
        assert!(feed(&mut r, addr(1), true, &ds[..1]).is_empty());
    }
    assert_eq!(r.take_evicted(), 1);
    assert_eq!(r.take_evicted(), 0, "counted once");
    assert_eq!(r.in_progress(), SLOTS_PER_SOURCE);
    // The chunk that was late arrives after all: the message is gone, nothing completes.
    assert!(feed(&mut r, addr(1), true, &lost[3..4]).is_empty());
}

#[test]
fn forged_chunk_headers_are_malformed() {
    let cutter = Cutter::new(MTU).unwrap();
    let good = cut(&cutter, 5, &message(5_000, 5));
    let forge = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut d = good[0].clone();
        f(&mut d);
        parse(&d).map(drop)
    };
    assert_eq!(forge(&|_| ()), Ok(()));
    assert_eq!(forge(&|d| d[0] = b'X'), Err(Refused::Malformed), "magic");
    assert_eq!(forge(&|d| d[2] = 1), Err(Refused::Malformed), "the unchunked version 1");
    assert_eq!(forge(&|d| d[3] = 1), Err(Refused::Malformed), "type");
    assert_eq!(forge(&|d| d[9] = 0), Err(Refused::Malformed), "no chunks");
    assert_eq!(forge(&|d| d[8] = d[9]), Err(Refused::Malformed), "index past the count");
    assert_eq!(forge(&|d| d.truncate(100)), Err(Refused::Malformed), "a short middle chunk");
    assert_eq!(forge(&|d| d.push(0)), Err(Refused::Malformed), "a long middle chunk");
    assert_eq!(forge(&|d| d.truncate(CHUNK_HEADER_LEN)), Err(Refused::Malformed), "empty");
    assert_eq!(parse(&[]), Err(Refused::Malformed));
    assert_eq!(parse(&[0xff; 100]), Err(Refused::Malformed));
    // Chunks that contradict the message's first chunk.
    let mut r = Reassembly::new();
    assert!(feed(&mut r, addr(1), true, &good[..1]).is_empty());
    let mut other_count = good[1].clone();
    other_count[9] += 1;
    assert_eq!(r.add(addr(1), true, &parse(&other_count).unwrap()), Err(Refused::Malformed));
    let short_stride = cut(&Cutter::new(1400).unwrap(), 5, &message(5_000, 5));
    assert_eq!(r.add(addr(1), true, &parse(&short_stride[1]).unwrap()), Err(Refused::Malformed));
    // The real chunks still complete the message.
    assert_eq!(feed(&mut r, addr(1), true, &good[1..]), [message(5_000, 5)]);
}

#[test]
fn oversize_counts_and_strides_are_malformed() {
    let cutter = Cutter::new(MTU).unwrap();
    let mut d = cutter.header(1, 254, 255).to_vec();
    d.extend_from_slice(&[0; 10]);
    assert_eq!(parse(&d), Err(Refused::Malformed), "255 chunks of 1460 bytes exceed a message");
    let mut huge = Cutter::new(MTU).unwrap().header(1, 1, 2).to_vec();
    huge[10..12].copy_from_slice(&u16::MAX.to_be_bytes());
    huge.extend_from_slice(&[0; 10]);
    assert!(parse(&huge).is_ok(), "two chunks of up to 64 KiB fit");
    let mut past_the_end = huge.clone();
    past_the_end.extend_from_slice(&[0; 100]);
    assert_eq!(parse(&past_the_end), Err(Refused::Malformed), "but not past the largest message");
    let mut three = huge.clone();
    three[8..10].copy_from_slice(&[2, 3]);
    assert_eq!(parse(&three), Err(Refused::Malformed), "three do not");
    // The largest legal message is reassembled within the buffer.
    let max = message(MAX_MESSAGE, 6);
    assert_eq!(feed(&mut Reassembly::new(), addr(1), false, &cut(&cutter, 1, &max)), [max]);
}

#[test]
fn forgeries_from_many_sources_stay_bounded_and_spare_trusted_messages() {
    let cutter = Cutter::new(MTU).unwrap();
    let mut r = Reassembly::new();
    let real = message(20_000, 7);
    let ds = cut(&cutter, 77, &real);
    assert!(feed(&mut r, addr(1), true, &ds[..5]).is_empty());
    // A flood of first chunks of never-completed messages from 1000 spoofed addresses.
    for port in 1000..2000u16 {
        for id in 0..3 {
            let forged = cut(&cutter, id, &message(3_000, 0));
            assert!(feed(&mut r, addr(port), false, &forged[..1]).is_empty());
        }
        assert!(r.in_progress() <= MAX_SLOTS);
    }
    assert_eq!(r.in_progress(), MAX_SLOTS);
    assert!(r.take_evicted() >= 3000 - MAX_SLOTS as u64);
    // The trusted sender's message in progress survived the flood.
    assert_eq!(feed(&mut r, addr(1), true, &ds[5..]), [real]);
    // One source alone holds at most its share.
    let mut r = Reassembly::new();
    for id in 0..100 {
        let forged = cut(&cutter, id, &message(3_000, 0));
        assert!(feed(&mut r, addr(9), true, &forged[..1]).is_empty());
    }
    assert_eq!(r.in_progress(), SLOTS_PER_SOURCE);
    assert_eq!(r.take_evicted(), 100 - SLOTS_PER_SOURCE as u64);
}
