//! `parse_meta` on arbitrary bytes: no panic, and every recorded part lies inside
//! the message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mailcluster_server::message::parse_meta;

fuzz_target!(|data: &[u8]| {
    let meta = parse_meta(data);
    assert_eq!(meta.size as usize, data.len());
    for p in &meta.parts {
        assert!(p.header_start <= p.body_start && p.body_start <= p.body_end);
        assert!(p.body_end as usize <= data.len());
    }
});
