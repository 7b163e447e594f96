// `sqlx::migrate!` embeds the migration files at compile time; without this a new
// or edited migration would not be picked up by an incremental build.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
