//! RFC 5173, body: `:raw`, `:text` and `:content` over the decoded parts.

mod common;

use common::*;

fn multipart() -> Vec<u8> {
    message(
        &[
            "From: a@example.org",
            "Subject: parts",
            "MIME-Version: 1.0",
            "Content-Type: multipart/alternative; boundary=\"b1\"",
        ],
        "--b1\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\nPlain caf=C3=A9 text\r\n\
--b1\r\nContent-Type: text/html\r\n\r\n<p>Html <b>bold</b> words</p>\r\n\
--b1\r\nContent-Type: application/octet-stream\r\nContent-Transfer-Encoding: base64\r\n\r\nc2VjcmV0IGJpbmFyeQ==\r\n--b1--\r\n",
    )
}

const REQ: &str = ", \"body\"";

#[test]
fn section_5_1_raw_is_the_undecoded_body() {
    let m = multipart();
    assert!(holds(REQ, "body :raw :contains \"caf=C3=A9\"", &m));
    assert!(holds(REQ, "body :raw :contains \"c2VjcmV0\"", &m));
    assert!(!holds(REQ, "body :raw :contains \"From: a@example.org\"", &m));
}

#[test]
fn section_5_3_text_is_the_decoded_text_parts() {
    let m = multipart();
    assert!(holds(REQ, "body :text :contains \"café\"", &m));
    assert!(holds(REQ, "body :contains \"bold words\"", &m));
    assert!(!holds(REQ, "body :text :contains \"<b>\"", &m));
    assert!(!holds(REQ, "body :text :contains \"secret\"", &m));
    assert!(holds(REQ, "body :contains \"anvil\"", &simple_message()));
}

#[test]
fn section_5_2_content_selects_parts_by_type() {
    let m = multipart();
    assert!(holds(REQ, "body :content \"text/html\" :contains \"bold\"", &m));
    assert!(!holds(REQ, "body :content \"text/html\" :contains \"café\"", &m));
    assert!(holds(REQ, "body :content \"text\" :contains \"café\"", &m));
    assert!(!holds(REQ, "body :content \"image\" :contains \"a\"", &m));
}

#[test]
fn body_needs_its_require() {
    compile_error("if body :contains \"x\" { keep; }");
}
