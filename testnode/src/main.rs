//! `mailcluster-test-node`: a Kubernetes node for tests. It registers a Node, keeps
//! its Lease fresh, and runs every Pod the scheduler binds to it as local processes,
//! each Pod in a network namespace on the node's bridge and each container in a
//! mount namespace with its volumes. Images are not pulled: `--image REPO=PATH` says
//! which local executable stands for an image repository (any tag).
//!
//! Started by `scripts/kube-up.sh` (as root, on Linux); see docs/one-machine.md.

mod dns;
mod hosts;
mod net;
mod pod;
mod spawn;
mod volumes;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher;
use kube::{Api, Client, Config};
use serde_json::json;
use tokio::sync::watch;

use crate::net::{Bridge, Ipam};
use crate::pod::{Handle, NodeCtx, PodWorker};

#[derive(Parser)]
#[command(about = "A Kubernetes node that runs its Pods as local processes (tests only)")]
struct Args {
    /// Credentials of this node (CN system:node:<name>, O system:nodes).
    #[arg(long)]
    kubeconfig: PathBuf,
    #[arg(long, default_value = "mc-node-1")]
    name: String,
    /// State: one directory per Pod with its volumes, hosts file and logs.
    #[arg(long)]
    dir: PathBuf,
    #[arg(long, default_value = "mcbr0")]
    bridge: String,
    /// The node's address on the bridge and the Pods' subnet.
    #[arg(long, default_value = "10.244.0.1/24")]
    pod_cidr: String,
    /// `REPOSITORY=EXECUTABLE`: Pods whose image is REPOSITORY (any tag or digest)
    /// run EXECUTABLE with the container's args.
    #[arg(long = "image")]
    images: Vec<String>,
    /// `PORT`: a service of the host listening on 127.0.0.1:PORT is offered to Pods at
    /// the node's address, PORT (databases on this machine for the Pods).
    #[arg(long = "host-port")]
    host_ports: Vec<u16>,
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    /// Credentials of the cluster DNS, which reads EndpointSlices (the ready
    /// addresses of headless Services) as CoreDNS does with its own account; a
    /// node's credentials may not. Default: the node's.
    #[arg(long)]
    dns_kubeconfig: Option<PathBuf>,
    /// What the node offers the scheduler. Pods are processes sharing this machine:
    /// requests are bookkeeping, not isolation.
    #[arg(long, default_value = "16")]
    cpu: String,
    #[arg(long, default_value = "32Gi")]
    memory: String,
    #[arg(long, default_value = "110")]
    max_pods: String,
    /// `KEY=VALUE:EFFECT` taints of the Node: with one, only Pods that tolerate it
    /// run here (a namespace can give its Pods the toleration, see kube-up.sh).
    #[arg(long = "taint")]
    taints: Vec<String>,
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .init();
    let args = Args::parse();
    let (gw, prefix) = args.pod_cidr.split_once('/').ok_or_else(|| anyhow!("--pod-cidr ADDRESS/PREFIX"))?;
    let bridge = Bridge { name: args.bridge.clone(), gateway: gw.parse()?, prefix: prefix.parse()? };
    bridge.ensure()?;
    bridge.clean_leftovers();
    let images = args
        .images
        .iter()
        .map(|m| {
            let (repo, path) =
                m.split_once('=').ok_or_else(|| anyhow!("--image REPOSITORY=EXECUTABLE, got {m}"))?;
            let path = PathBuf::from(path);
            anyhow::ensure!(path.is_file(), "--image {repo}: {} is not a file", path.display());
            Ok((repo.to_string(), path))
        })
        .collect::<Result<Vec<_>>>()?;
    std::fs::create_dir_all(args.dir.join("pods"))?;

    let client = client_from(&args.kubeconfig).await?;
    let dns_client = match &args.dns_kubeconfig {
        Some(path) => client_from(path).await?,
        None => client.clone(),
    };

    for port in &args.host_ports {
        tokio::spawn(forward(bridge.gateway, *port));
    }

    let hosts = Arc::new(hosts::Hosts::new(&args.cluster_domain));
    tokio::spawn(dns::serve(bridge.gateway, hosts.clone()));
    let ctx = Arc::new(NodeCtx {
        client: client.clone(),
        node_name: args.name.clone(),
        ipam: Mutex::new(Ipam::new(&bridge)),
        bridge,
        dir: args.dir.clone(),
        images,
        hosts: hosts.clone(),
    });
    register(&ctx, &args).await.context("register the Node")?;
    tokio::spawn(heartbeat(ctx.clone()));
    tokio::spawn(watch_services(client.clone(), hosts.clone()));
    tokio::spawn(watch_endpoint_slices(dns_client, hosts.clone()));
    // Containers need the API server's Service address in their environment.
    for _ in 0..100 {
        if hosts.api_server_env().len() > 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let handles: Arc<Mutex<BTreeMap<String, Handle>>> = Arc::default();
    let pods_loop = tokio::spawn(watch_pods(ctx.clone(), handles.clone()));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
        r = pods_loop => { r??; }
    }
    // Going away: every Pod's processes end with the node (its Pods are gone with
    // the cluster; leftovers would hold ports and addresses).
    tracing::info!("stopping: ending every pod");
    for h in handles.lock().unwrap_or_else(|e| e.into_inner()).values() {
        let _ = h.stop.send(Some(0));
    }
    for _ in 0..100 {
        if handles.lock().unwrap_or_else(|e| e.into_inner()).values().all(|h| h.done) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ctx.bridge.clean_leftovers();
    Ok(())
}

async fn register(ctx: &NodeCtx, args: &Args) -> Result<()> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let taints = args
        .taints
        .iter()
        .map(|t| {
            let (kv, effect) =
                t.split_once(':').ok_or_else(|| anyhow!("--taint KEY=VALUE:EFFECT, got {t}"))?;
            let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
            Ok(json!({"key": key, "value": value, "effect": effect}))
        })
        .collect::<Result<Vec<_>>>()?;
    let resources =
        json!({"cpu": args.cpu, "memory": args.memory, "pods": args.max_pods, "ephemeral-storage": "100Gi"});
    let node: Node = serde_json::from_value(json!({
        "metadata": {
            "name": args.name,
            "labels": {
                "kubernetes.io/hostname": args.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": std::env::consts::ARCH.replace("x86_64", "amd64").replace("aarch64", "arm64"),
                "topology.kubernetes.io/zone": "local-a",
                "topology.kubernetes.io/region": "local",
                "mailcluster.dev/test-node": "true",
            },
        },
        "spec": {"podCIDR": ipnet_of(&ctx.bridge), "podCIDRs": [ipnet_of(&ctx.bridge)], "taints": taints},
    }))?;
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    let status = json!({"status": {
        "capacity": resources,
        "allocatable": resources,
        "addresses": [
            {"type": "InternalIP", "address": ctx.bridge.gateway.to_string()},
            {"type": "Hostname", "address": args.name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
        "nodeInfo": {
            "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "", "osImage": "mailcluster test node",
            "containerRuntimeVersion": "process://0", "kubeletVersion": "v1.36.3", "kubeProxyVersion": "",
            "operatingSystem": "linux", "architecture": std::env::consts::ARCH,
        },
    }});
    nodes.patch_status(&args.name, &PatchParams::default(), &Patch::Merge(&status)).await?;
    report_ready(ctx).await?;
    tracing::info!(node = %args.name, "registered");
    Ok(())
}

fn ipnet_of(b: &Bridge) -> String {
    let mask = if b.prefix == 0 { 0 } else { u32::MAX << (32 - b.prefix) };
    format!("{}/{}", Ipv4Addr::from(u32::from(b.gateway) & mask), b.prefix)
}

async fn report_ready(ctx: &NodeCtx) -> Result<()> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let cond = |t: &str, s: &str, reason: &str| json!({"type": t, "status": s, "reason": reason, "lastHeartbeatTime": now, "lastTransitionTime": now});
    let status = json!({"status": {"conditions": [
        cond("Ready", "True", "KubeletReady"),
        cond("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        cond("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        cond("PIDPressure", "False", "KubeletHasSufficientPID"),
    ]}});
    nodes.patch_status(&ctx.node_name, &PatchParams::default(), &Patch::Strategic(&status)).await?;
    Ok(())
}

/// The node's Lease every 10 s and its Ready condition every minute: the node
/// lifecycle controller marks a node whose Lease is 40 s old as unreachable.
async fn heartbeat(ctx: Arc<NodeCtx>) {
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), "kube-node-lease");
    let mut tick = 0u32;
    loop {
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": ctx.node_name},
            "spec": {"holderIdentity": ctx.node_name, "leaseDurationSeconds": 40, "renewTime": now},
        });
        if let Err(e) = leases
            .patch(
                &ctx.node_name,
                &PatchParams::apply("mailcluster-test-node").force(),
                &Patch::Apply(&lease),
            )
            .await
        {
            tracing::warn!("lease: {e}");
        }
        if tick.is_multiple_of(6)
            && let Err(e) = report_ready(&ctx).await
        {
            tracing::warn!("node status: {e}");
        }
        tick += 1;
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
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

async fn watch_pods(ctx: Arc<NodeCtx>, handles: Arc<Mutex<BTreeMap<String, Handle>>>) -> Result<()> {
    let api: Api<Pod> = Api::all(ctx.client.clone());
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={}", ctx.node_name));
    let mut stream = watcher(api.clone(), cfg).boxed();
    while let Some(ev) = stream.next().await {
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                tracing::warn!("pods watch: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        match ev {
            watcher::Event::Apply(p) | watcher::Event::InitApply(p) => on_pod(&ctx, &handles, p).await,
            watcher::Event::Delete(p) => {
                let uid = p.metadata.uid.clone().unwrap_or_default();
                if let Some(h) = handles.lock().unwrap_or_else(|e| e.into_inner()).remove(&uid) {
                    // Gone without the grace period (a forced delete): end it now.
                    let _ = h.stop.send(Some(0));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

async fn on_pod(ctx: &Arc<NodeCtx>, handles: &Arc<Mutex<BTreeMap<String, Handle>>>, p: Pod) {
    let uid = p.metadata.uid.clone().unwrap_or_default();
    let deleting = p.metadata.deletion_timestamp.is_some();
    let grace = p.metadata.deletion_grace_period_seconds.unwrap_or(0);
    let phase = p.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
    let terminal = phase == "Succeeded" || phase == "Failed";
    {
        let mut h = handles.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(handle) = h.get_mut(&uid) {
            if deleting {
                if handle.done {
                    h.remove(&uid);
                } else {
                    let _ = handle.stop.send(Some(grace));
                    return;
                }
            } else {
                return;
            }
        } else if !deleting && !terminal {
            let (tx, rx) = watch::channel(None);
            h.insert(uid.clone(), Handle { stop: tx, done: false });
            let worker = PodWorker::new(ctx.clone(), p, rx);
            let handles = handles.clone();
            tokio::spawn(async move {
                worker.run().await;
                if let Some(h) = handles.lock().unwrap_or_else(|e| e.into_inner()).get_mut(&uid) {
                    h.done = true;
                }
            });
            return;
        }
    }
    // Deleting a Pod that has no processes here (finished, or from before a node
    // restart): nothing to stop, the node confirms the delete.
    if deleting {
        let api: Api<Pod> =
            Api::namespaced(ctx.client.clone(), p.metadata.namespace.as_deref().unwrap_or("default"));
        let dp = kube::api::DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(kube::api::Preconditions {
                uid: p.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        let _ = api.delete(p.metadata.name.as_deref().unwrap_or(""), &dp).await;
    }
}

/// Offers 127.0.0.1:port at the node's address: PostgreSQL and Redis of this
/// machine listen on loopback only, which a Pod's namespace cannot reach.
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
