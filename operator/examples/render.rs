//! Prints what the operator would apply for a MailCluster file:
//! `cargo run -p mailcluster-operator --example render -- cluster.yaml`.
fn main() -> anyhow::Result<()> {
    let path = std::env::args().nth(1).ok_or_else(|| anyhow::anyhow!("usage: render FILE"))?;
    print!("{}", mailcluster_operator::render(&std::fs::read_to_string(path)?)?);
    Ok(())
}
