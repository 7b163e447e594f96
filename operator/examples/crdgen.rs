//! Prints the MailCluster CRD: `cargo run -p mailcluster-operator --example crdgen > crds/mailclusters.mailcluster.dev.yaml`.
fn main() {
    print!("{}", mailcluster_operator::crd_yaml());
}
