use bytes::{BufMut, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use super::*;

fn round_trip(frame: Frame) {
    let mut codec = FrameCodec::default();
    let mut buf = BytesMut::new();
    codec.encode(frame.clone(), &mut buf).expect("encode");
    let decoded = codec.decode(&mut buf).expect("decode").expect("complete frame");
    assert_eq!(decoded, frame);
    assert!(buf.is_empty());
}

#[test]
fn every_frame_type_round_trips() {
    round_trip(Frame::Data { stream_id: 7, fin: true, data: Bytes::from_static(b"hello") });
    round_trip(Frame::Data { stream_id: 1, fin: false, data: Bytes::new() });
    round_trip(Frame::SynStream {
        stream_id: 3,
        associated_to: 1,
        priority: 5,
        flags: FLAG_FIN | FLAG_UNIDIRECTIONAL,
        header_block: Bytes::from_static(b"\x78\x01abc"),
    });
    round_trip(Frame::SynReply { stream_id: 3, fin: false, header_block: Bytes::from_static(b"x") });
    round_trip(Frame::RstStream { stream_id: 9, status: status::CANCEL });
    round_trip(Frame::Settings { clear: true, entries: vec![Setting { flags: 1, id: 7, value: 65536 }] });
    round_trip(Frame::Ping { id: 0xffff_fff1 });
    round_trip(Frame::GoAway { last_good_stream_id: 11, status: 0 });
    round_trip(Frame::Headers { stream_id: 5, fin: true, header_block: Bytes::from_static(b"h") });
    round_trip(Frame::WindowUpdate { stream_id: 0, delta: 1 << 20 });
}

#[test]
fn frames_split_across_reads_wait_for_the_rest() {
    let mut codec = FrameCodec::default();
    let mut whole = BytesMut::new();
    codec.encode(Frame::Ping { id: 1 }, &mut whole).expect("encode");
    let mut partial = BytesMut::from(&whole[..5]);
    assert_eq!(codec.decode(&mut partial).expect("decode"), None);
    partial.extend_from_slice(&whole[5..]);
    assert_eq!(codec.decode(&mut partial).expect("decode"), Some(Frame::Ping { id: 1 }));
}

#[test]
fn a_frame_cut_short_by_eof_is_an_error() {
    let mut codec = FrameCodec::default();
    let mut buf = BytesMut::new();
    codec.encode(Frame::RstStream { stream_id: 1, status: 5 }, &mut buf).expect("encode");
    buf.truncate(11);
    assert!(matches!(codec.decode_eof(&mut buf), Err(Error::TruncatedFrame(11))));
}

#[test]
fn a_control_frame_shorter_than_its_type_needs_is_malformed() {
    // RST_STREAM announcing a 4-byte body (it needs 8).
    let mut buf = BytesMut::new();
    buf.put_u16(0x8003);
    buf.put_u16(3);
    buf.put_u32(4);
    buf.put_u32(1);
    let err = FrameCodec::default().decode(&mut buf).expect_err("malformed");
    assert!(matches!(err, Error::MalformedFrame(_)), "{err}");
    // SETTINGS whose count does not match its length.
    let mut buf = BytesMut::new();
    buf.put_u16(0x8003);
    buf.put_u16(4);
    buf.put_u32(4);
    buf.put_u32(1000);
    assert!(FrameCodec::default().decode(&mut buf).is_err());
}

#[test]
fn oversized_control_frames_and_other_versions_are_refused() {
    let mut buf = BytesMut::new();
    buf.put_u16(0x8003);
    buf.put_u16(1);
    buf.put_u32(0x0010_0000);
    let err = FrameCodec::new(64 * 1024, 1 << 20).decode(&mut buf).expect_err("too large");
    assert!(matches!(err, Error::FrameTooLarge { kind: "control", .. }), "{err}");

    let mut buf = BytesMut::new();
    buf.put_u16(0x8002);
    buf.put_u16(6);
    buf.put_u32(4);
    buf.put_u32(1);
    assert!(matches!(FrameCodec::default().decode(&mut buf), Err(Error::UnsupportedVersion(2))));
}

#[test]
fn unknown_control_frames_are_skipped_not_fatal() {
    let mut buf = BytesMut::new();
    buf.put_u16(0x8003);
    buf.put_u16(0x00ee);
    buf.put_u32(2);
    buf.put_u16(0);
    assert_eq!(
        FrameCodec::default().decode(&mut buf).expect("decode"),
        Some(Frame::Unknown { frame_type: 0xee })
    );
}
