//! RFC 3894, copy: `:copy` leaves the implicit keep in place.

mod common;

use common::*;
use mailcluster_sieve::Action;

#[test]
fn section_3_redirect_and_fileinto_with_copy_keep_the_message() {
    let s = r#"require ["copy", "fileinto"]; redirect :copy "b@example.com"; fileinto :copy "Archive";"#;
    assert_eq!(
        actions(s, &simple_message()),
        vec![Action::Redirect { address: "b@example.com".into(), copy: true }, fileinto("Archive"), keep()]
    );
    let s = r#"require ["copy", "fileinto"]; redirect :copy "b@example.com"; fileinto "Archive";"#;
    assert!(!actions(s, &simple_message()).contains(&keep()));
}

#[test]
fn copy_needs_its_require() {
    let e = compile_error("redirect :copy \"b@example.com\";");
    assert!(e.message.contains("copy"), "{e}");
}
