//! `cargo bench -p mailcluster-server --bench parse_meta`: time `parse_meta` on
//! messages SMTP delivery sees (plain 4 KB text, multipart with an attachment).
//! Prints microseconds per message; no harness, no extra dependency.

use std::time::Instant;

use mail_builder::MessageBuilder;
use mail_builder::mime::MimePart;
use mailcluster_model::message::parse_meta;

fn time(name: &str, raw: &[u8]) {
    let n = 20_000u32;
    // Warm-up, then measure.
    for _ in 0..1000 {
        std::hint::black_box(parse_meta(std::hint::black_box(raw)));
    }
    let start = Instant::now();
    for _ in 0..n {
        std::hint::black_box(parse_meta(std::hint::black_box(raw)));
    }
    let per = start.elapsed().as_secs_f64() * 1e6 / f64::from(n);
    println!("{name:<28} {:>7} bytes  {per:>8.2} µs/message", raw.len());
}

fn main() {
    let plain = MessageBuilder::new()
        .from(("Alice", "alice@example.com"))
        .to("bob@example.org")
        .subject("A 4 KB message")
        .text_body("lorem ipsum dolor sit amet ".repeat(150))
        .write_to_vec()
        .expect("build");
    let multipart = MessageBuilder::new()
        .from(("Alice", "alice@example.com"))
        .to(vec!["bob@example.org", "carol@example.org"])
        .subject("Report")
        .body(MimePart::new(
            "multipart/mixed",
            vec![
                MimePart::new(
                    "multipart/alternative",
                    vec![
                        MimePart::new("text/plain", "see the attachment ".repeat(40)),
                        MimePart::new("text/html", "<p>see the attachment</p>".repeat(40)),
                    ],
                ),
                MimePart::new("application/pdf", vec![0x25u8; 16 * 1024]).attachment("report.pdf"),
            ],
        ))
        .write_to_vec()
        .expect("build");
    time("text/plain 4 KB", &plain);
    time("multipart + 16 KB attachment", &multipart);
}
