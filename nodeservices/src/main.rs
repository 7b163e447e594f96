//! `mailcluster-node-services`: what the one-machine cluster's node offers its Pods
//! besides the kubelet, on the node's address:
//!
//! - the cluster DNS (port 53): Service names answer with their cluster IP,
//!   headless ones with their ready endpoints, every other name is NXDOMAIN at
//!   once — the test machine has no network, and a fast negative answer is what
//!   lets a mail server's SPF and DMARC checks finish;
//! - this machine's services on 127.0.0.1 (`--host-port`, PostgreSQL and Redis)
//!   forwarded from the node's address, where Services without a selector send
//!   Pods. A DNAT rule cannot do it: the Service's own DNAT to the node's address
//!   is the one translation a connection gets.
//!
//! Started by `scripts/kube-up.sh` (as root, on Linux); see docs/one-machine.md.

mod dns;
mod hosts;

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher;
use kube::{Api, Client, Config};

#[derive(Parser)]
#[command(about = "The cluster DNS and host services of the one-machine test cluster (tests only)")]
struct Args {
    /// Credentials that may list and watch Services and EndpointSlices.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// The node's address: DNS and the forwarded ports listen here.
    #[arg(long)]
    address: Ipv4Addr,
    /// `PORT`: a service of the host listening on 127.0.0.1:PORT is offered to Pods at
    /// the node's address, PORT (databases on this machine for the Pods).
    #[arg(long = "host-port")]
    host_ports: Vec<u16>,
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .init();
    let args = Args::parse();
    let client = client_from(&args.kubeconfig).await?;
    for port in &args.host_ports {
        tokio::spawn(forward(args.address, *port));
    }
    let hosts = Arc::new(hosts::Hosts::new(&args.cluster_domain));
    tokio::spawn(watch_services(client.clone(), hosts.clone()));
    tokio::spawn(watch_endpoint_slices(client, hosts.clone()));
    let dns = tokio::spawn(dns::serve(args.address, hosts));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
        _ = dns => { anyhow::bail!("the cluster DNS stopped"); }
    }
    Ok(())
}

async fn client_from(path: &std::path::Path) -> Result<Client> {
    let kubeconfig = Kubeconfig::read_from(path)?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// The ready addresses behind each Service, for the DNS answers of headless ones.
async fn watch_endpoint_slices(client: Client, hosts: Arc<hosts::Hosts>) {
    let api: Api<EndpointSlice> = Api::all(client);
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::Apply(slice) | watcher::Event::InitApply(slice)) => {
                let service =
                    slice.metadata.labels.as_ref().and_then(|l| l.get("kubernetes.io/service-name")).cloned();
                // Ready, or not saying (the API's default for a missing condition).
                let ready = slice
                    .endpoints
                    .iter()
                    .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
                    .flat_map(|e| e.addresses.iter().filter_map(|a| a.parse::<Ipv4Addr>().ok()))
                    .collect();
                hosts.set_slice(
                    slice.metadata.namespace.as_deref().unwrap_or(""),
                    slice.metadata.name.as_deref().unwrap_or(""),
                    service,
                    ready,
                );
            }
            Ok(watcher::Event::Delete(slice)) => hosts.set_slice(
                slice.metadata.namespace.as_deref().unwrap_or(""),
                slice.metadata.name.as_deref().unwrap_or(""),
                None,
                Vec::new(),
            ),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!("endpointslices watch: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

async fn watch_services(client: Client, hosts: Arc<hosts::Hosts>) {
    let api: Api<Service> = Api::all(client);
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)) => {
                let ip = s.spec.as_ref().and_then(|s| s.cluster_ip.clone());
                hosts.set_service(
                    s.metadata.namespace.as_deref().unwrap_or(""),
                    s.metadata.name.as_deref().unwrap_or(""),
                    ip,
                );
            }
            Ok(watcher::Event::Delete(s)) => {
                hosts.set_service(
                    s.metadata.namespace.as_deref().unwrap_or(""),
                    s.metadata.name.as_deref().unwrap_or(""),
                    None,
                );
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!("services watch: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

async fn forward(gateway: Ipv4Addr, port: u16) {
    let listener = match tokio::net::TcpListener::bind((gateway, port)).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("host port {port}: bind {gateway}:{port}: {e}");
            return;
        }
    };
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else { continue };
        tokio::spawn(async move {
            if let Ok(mut out) = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await {
                let _ = inbound.set_nodelay(true);
                let _ = out.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
            }
        });
    }
}
