//! The store is split by roles so that a part of the server, and a test double,
//! depends on the operations of its role only: no role trait grows past 20
//! methods, and `Store` itself declares none (it is the sum of the roles).

use std::path::Path;

#[test]
fn every_store_role_has_at_most_twenty_methods() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../server/src/store/mod.rs");
    let file = syn::parse_file(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut roles = Vec::new();
    for item in &file.items {
        let syn::Item::Trait(t) = item else { continue };
        let methods = t.items.iter().filter(|i| matches!(i, syn::TraitItem::Fn(_))).count();
        if t.ident == "Store" {
            assert_eq!(methods, 0, "Store declares methods; they belong in a role");
            assert!(t.supertraits.len() >= 5, "Store is the sum of the roles");
            continue;
        }
        roles.push((t.ident.to_string(), methods));
    }
    assert!(roles.len() >= 5, "role traits in store/mod.rs: {roles:?}");
    let over: Vec<_> = roles.iter().filter(|(_, n)| *n > 20).collect();
    assert!(over.is_empty(), "roles over 20 methods: {over:?}");
}
