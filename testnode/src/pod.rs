//! One Pod's life on this node, as the kubelet leads it: network and volumes, init
//! containers in order, containers under their restart policy, probes, status back
//! to the API server, and on deletion preStop → SIGTERM → grace → SIGKILL before the
//! final delete.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use chrono::{SecondsFormat, Utc};
use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{Notify, watch};

use crate::net::{Bridge, Ipam, PodNet};
use crate::spawn::{self, ContainerProcess, Mount};
use crate::volumes;

pub struct NodeCtx {
    pub client: Client,
    pub node_name: String,
    pub bridge: Bridge,
    pub ipam: Mutex<Ipam>,
    pub dir: PathBuf,
    /// Image repository (no tag or digest) → the executable that stands for it.
    pub images: Vec<(String, PathBuf)>,
    pub hosts: Arc<crate::hosts::Hosts>,
}

impl NodeCtx {
    fn program_for(&self, image: &str) -> Option<PathBuf> {
        let repo = repository(image);
        self.images.iter().find(|(r, _)| *r == repo).map(|(_, p)| p.clone())
    }
}

/// `ghcr.io/x/y:1.2@sha256:…` → `ghcr.io/x/y`.
pub fn repository(image: &str) -> &str {
    let no_digest = image.split('@').next().unwrap_or(image);
    match no_digest.rfind(':') {
        Some(i) if !no_digest[i..].contains('/') => &no_digest[..i],
        _ => no_digest,
    }
}

fn now() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true)
}

#[derive(Clone)]
enum Phase {
    Waiting(String, String),
    Running { since: String },
    Terminated { code: i32, signal: Option<i32>, reason: String, started: String, finished: String },
}

#[derive(Clone)]
struct CStatus {
    name: String,
    image: String,
    phase: Phase,
    last: Option<Phase>,
    restarts: i32,
    ready: bool,
    started: bool,
    pid: Option<u32>,
}

impl CStatus {
    fn new(c: &Container) -> Self {
        CStatus {
            name: c.name.clone(),
            image: c.image.clone().unwrap_or_default(),
            phase: Phase::Waiting("ContainerCreating".into(), String::new()),
            last: None,
            restarts: 0,
            ready: false,
            started: false,
            pid: None,
        }
    }

    fn json(&self) -> Value {
        let state = |p: &Phase| match p {
            Phase::Waiting(reason, message) => json!({"waiting": {"reason": reason, "message": message}}),
            Phase::Running { since } => json!({"running": {"startedAt": since}}),
            Phase::Terminated { code, signal, reason, started, finished } => json!({"terminated": {
                "exitCode": code, "signal": signal, "reason": reason, "startedAt": started, "finishedAt": finished,
            }}),
        };
        json!({
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "containerID": self.pid.map(|p| format!("process://{p}")),
            "restartCount": self.restarts,
            "ready": self.ready,
            "started": self.started,
            "state": state(&self.phase),
            "lastState": self.last.as_ref().map(state).unwrap_or(json!({})),
        })
    }
}

struct PodState {
    phase: &'static str,
    ip: Option<Ipv4Addr>,
    start_time: String,
    initialized: bool,
    init: Vec<CStatus>,
    containers: Vec<CStatus>,
    message: Option<String>,
}

pub struct PodWorker {
    ctx: Arc<NodeCtx>,
    pod: Pod,
    api: Api<Pod>,
    state: Mutex<PodState>,
    changed: Notify,
    /// Set when the Pod is to stop: the grace period in seconds.
    stop: watch::Receiver<Option<i64>>,
    dir: PathBuf,
}

/// Running container: how to reach it for probes and signals.
struct Running {
    pid: u32,
}

impl PodWorker {
    pub fn new(ctx: Arc<NodeCtx>, pod: Pod, stop: watch::Receiver<Option<i64>>) -> Arc<Self> {
        let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        let dir = ctx.dir.join("pods").join(format!("{ns}_{name}_{uid}"));
        let api = Api::namespaced(ctx.client.clone(), &ns);
        let state = PodState {
            phase: "Pending",
            ip: None,
            start_time: now(),
            initialized: spec.init_containers.as_ref().is_none_or(|v| v.is_empty()),
            init: spec.init_containers.iter().flatten().map(CStatus::new).collect(),
            containers: spec.containers.iter().map(CStatus::new).collect(),
            message: None,
        };
        Arc::new(PodWorker { ctx, pod, api, state: Mutex::new(state), changed: Notify::new(), stop, dir })
    }

    fn name(&self) -> String {
        format!(
            "{}/{}",
            self.pod.metadata.namespace.as_deref().unwrap_or("default"),
            self.pod.metadata.name.as_deref().unwrap_or("")
        )
    }

    fn restart_policy(&self) -> String {
        self.pod.spec.as_ref().and_then(|s| s.restart_policy.clone()).unwrap_or_else(|| "Always".into())
    }

    fn stopping(&self) -> Option<i64> {
        *self.stop.borrow()
    }

    fn update(&self, f: impl FnOnce(&mut PodState)) {
        f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()));
        self.changed.notify_one();
    }

    /// The whole life; returns when the Pod is gone from this node.
    pub async fn run(self: Arc<Self>) {
        let publisher = tokio::spawn(self.clone().publish_status());
        let result = self.clone().live().await;
        if let Err(e) = &result {
            tracing::warn!(pod = %self.name(), "pod failed: {e:#}");
        }
        // Let the last status reach the API server before the object may go.
        tokio::time::sleep(Duration::from_millis(300)).await;
        publisher.abort();
        self.publish_once().await;
        if self.stopping().is_some() {
            let uid = self.pod.metadata.uid.clone();
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions { uid, resource_version: None }),
                ..Default::default()
            };
            let name = self.pod.metadata.name.clone().unwrap_or_default();
            if let Err(e) = self.api.delete(&name, &dp).await
                && !matches!(&e, kube::Error::Api(s) if s.code == 404 || s.code == 409)
            {
                tracing::warn!(pod = %self.name(), "final delete: {e}");
            }
        }
        let _ = std::fs::remove_dir_all(self.dir.join("volumes"));
    }

    async fn live(self: Arc<Self>) -> Result<()> {
        std::fs::create_dir_all(self.dir.join("logs"))?;
        let key = self.pod.metadata.uid.clone().unwrap_or_default();
        let ip = self
            .ctx
            .ipam
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .allocate()
            .ok_or_else(|| anyhow!("no address left"))?;
        let net = match PodNet::create(&self.ctx.bridge, &key, ip) {
            Ok(n) => n,
            Err(e) => {
                self.ctx.ipam.lock().unwrap_or_else(|e| e.into_inner()).release(ip);
                return Err(e);
            }
        };
        let result = self.clone().with_network(&net).await;
        self.ctx.hosts.forget(&self.dir.join("hosts"));
        net.destroy();
        self.ctx.ipam.lock().unwrap_or_else(|e| e.into_inner()).release(ip);
        result
    }

    async fn with_network(self: Arc<Self>, net: &PodNet) -> Result<()> {
        self.update(|s| s.ip = Some(net.ip));
        let hostname = self.pod.metadata.name.clone().unwrap_or_default();
        let hosts_file = self.dir.join("hosts");
        self.ctx.hosts.register(hosts_file.clone(), hostname.clone(), net.ip)?;
        let resolv_conf = self.dir.join("resolv.conf");
        let ns = self.pod.metadata.namespace.as_deref().unwrap_or("default");
        std::fs::write(&resolv_conf, self.ctx.hosts.resolv_conf(self.ctx.bridge.gateway, ns))?;
        let vols = loop {
            match volumes::materialize(
                &self.ctx.client,
                &self.pod,
                &self.dir.join("volumes"),
                &net.ip.to_string(),
            )
            .await
            {
                Ok(v) => break v,
                Err(e) => {
                    let msg = format!("{e:#}");
                    self.update(|s| {
                        for c in s.containers.iter_mut() {
                            c.phase = Phase::Waiting("CreateContainerConfigError".into(), msg.clone());
                        }
                    });
                    if self.wait_stop(Duration::from_secs(2)).await {
                        return Ok(());
                    }
                }
            }
        };
        let spec = self.pod.spec.clone().unwrap_or_default();
        let env = self.ctx.hosts.api_server_env();
        let launch = Arc::new(Launch {
            vols,
            hosts_file,
            resolv_conf,
            hostname,
            net_path: net.path(),
            ip: net.ip,
            base_env: env,
        });

        for (i, c) in spec.init_containers.iter().flatten().enumerate() {
            loop {
                if self.stopping().is_some() {
                    return Ok(());
                }
                let code = self.clone().run_container(&launch, c, Slot::Init(i)).await?;
                if code == Some(0) {
                    break;
                }
                if self.restart_policy() == "Never" {
                    self.update(|s| s.phase = "Failed");
                    return Ok(());
                }
                if self.wait_stop(Duration::from_secs(2)).await {
                    return Ok(());
                }
            }
        }
        self.update(|s| s.initialized = true);
        let tasks: Vec<_> = spec
            .containers
            .iter()
            .enumerate()
            .map(|(i, c)| tokio::spawn(self.clone().supervise(launch.clone(), c.clone(), i)))
            .collect();
        for t in tasks {
            t.await??;
        }
        let failed = self.with_state(|s| {
            s.containers.iter().any(|c| matches!(c.phase, Phase::Terminated { code, .. } if code != 0))
        });
        if self.stopping().is_none() {
            self.update(|s| s.phase = if failed { "Failed" } else { "Succeeded" });
        }
        Ok(())
    }

    fn with_state<T>(&self, f: impl FnOnce(&PodState) -> T) -> T {
        f(&self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Sleeps `d` unless the Pod is told to stop first; true when it was.
    async fn wait_stop(&self, d: Duration) -> bool {
        let mut stop = self.stop.clone();
        if stop.borrow().is_some() {
            return true;
        }
        tokio::select! {
            _ = tokio::time::sleep(d) => self.stop.borrow().is_some(),
            _ = async { let _ = stop.wait_for(|s| s.is_some()).await; } => true,
        }
    }

    /// A container under the Pod's restart policy until it ends for good or the Pod stops.
    async fn supervise(self: Arc<Self>, launch: Arc<Launch>, c: Container, index: usize) -> Result<()> {
        let policy = self.restart_policy();
        let mut backoff = Duration::from_secs(1);
        loop {
            if self.stopping().is_some() {
                return Ok(());
            }
            let started = Instant::now();
            let code = self.clone().run_container(&launch, &c, Slot::Main(index)).await?;
            if self.stopping().is_some() {
                return Ok(());
            }
            let restart = match policy.as_str() {
                "Never" => false,
                "OnFailure" => code != Some(0),
                _ => true,
            };
            if !restart {
                return Ok(());
            }
            // The kubelet's crash-loop backoff: doubling up to 5 minutes, forgotten
            // after 10 minutes of running.
            if started.elapsed() > Duration::from_secs(600) {
                backoff = Duration::from_secs(1);
            }
            self.update(|s| {
                let cs = &mut s.containers[index];
                cs.last = Some(cs.phase.clone());
                cs.phase = Phase::Waiting(
                    "CrashLoopBackOff".into(),
                    format!("back-off {}s restarting", backoff.as_secs()),
                );
            });
            if self.wait_stop(backoff).await {
                return Ok(());
            }
            backoff = (backoff * 10).min(Duration::from_secs(300));
            self.update(|s| s.containers[index].restarts += 1);
        }
    }

    fn update_c(&self, slot: Slot, f: impl FnOnce(&mut CStatus)) {
        self.update(|s| match slot {
            Slot::Init(i) => f(&mut s.init[i]),
            Slot::Main(i) => f(&mut s.containers[i]),
        });
    }

    /// Runs one instance of a container to its end; the exit code (None: killed by a signal).
    async fn run_container(
        self: Arc<Self>,
        launch: &Launch,
        c: &Container,
        slot: Slot,
    ) -> Result<Option<i32>> {
        let image = c.image.clone().unwrap_or_default();
        let program = match (self.ctx.program_for(&image), c.command.as_ref().and_then(|v| v.first())) {
            (_, Some(cmd)) => PathBuf::from(which(cmd)),
            (Some(p), None) => p,
            (None, None) => {
                let msg = format!("image {image} is not one this test node runs (see its --image flags)");
                self.update_c(slot, |cs| cs.phase = Phase::Waiting("ErrImagePull".into(), msg.clone()));
                self.wait_stop(Duration::from_secs(3600 * 24)).await;
                return Ok(None);
            }
        };
        let env = volumes::container_env(
            &self.ctx.client,
            &self.pod,
            c,
            launch.base_env.clone(),
            &launch.ip.to_string(),
            &self.ctx.bridge.gateway.to_string(),
        )
        .await?;
        let mut args: Vec<String> =
            c.command.iter().flatten().skip(1).map(|a| volumes::expand(a, &env)).collect();
        args.extend(c.args.iter().flatten().map(|a| volumes::expand(a, &env)));
        let mut mounts = vec![
            Mount { source: launch.hosts_file.clone(), target: "/etc/hosts".into(), read_only: true },
            Mount { source: launch.resolv_conf.clone(), target: "/etc/resolv.conf".into(), read_only: true },
        ];
        for m in c.volume_mounts.iter().flatten() {
            let src = launch
                .vols
                .dirs
                .get(&m.name)
                .ok_or_else(|| anyhow!("container {}: no volume {}", c.name, m.name))?;
            let src = match &m.sub_path {
                Some(sp) if !sp.is_empty() => src.join(sp),
                _ => src.clone(),
            };
            mounts.push(Mount {
                source: src,
                target: m.mount_path.clone().into(),
                read_only: m.read_only == Some(true),
            });
        }
        let psc = self.pod.spec.as_ref().and_then(|s| s.security_context.clone()).unwrap_or_default();
        let csc = c.security_context.clone().unwrap_or_default();
        let uid = csc.run_as_user.or(psc.run_as_user).map(|u| u as u32);
        let gid = csc.run_as_group.or(psc.run_as_group).map(|g| g as u32);
        let mut groups: Vec<u32> = psc.supplemental_groups.iter().flatten().map(|g| *g as u32).collect();
        groups.extend(psc.fs_group.map(|g| g as u32));
        let log = self.dir.join("logs").join(format!("{}.log", c.name));
        let process = ContainerProcess {
            program,
            args,
            env,
            netns: launch.net_path.clone(),
            hostname: launch.hostname.clone(),
            mounts,
            uid,
            gid,
            supplemental_groups: groups,
            working_dir: c.working_dir.clone().map(PathBuf::from),
            log: log.clone(),
        };
        let started_at = now();
        let mut child = match spawn::spawn(&process) {
            Ok(ch) => ch,
            Err(e) => {
                let msg = format!("{e:#}");
                tracing::warn!(pod = %self.name(), container = %c.name, "start: {msg}");
                self.update_c(slot, |cs| {
                    cs.phase = Phase::Terminated {
                        code: 128,
                        signal: None,
                        reason: "StartError".into(),
                        started: started_at.clone(),
                        finished: now(),
                    }
                });
                return Ok(Some(128));
            }
        };
        let pid = child.id().unwrap_or(0);
        tracing::info!(pod = %self.name(), container = %c.name, pid, "started");
        self.update_c(slot, |cs| {
            cs.phase = Phase::Running { since: started_at.clone() };
            cs.pid = Some(pid);
            cs.started = c.startup_probe.is_none();
            cs.ready =
                matches!(slot, Slot::Main(_)) && c.startup_probe.is_none() && c.readiness_probe.is_none();
        });
        let running = Running { pid };
        let kill = Arc::new(Notify::new());
        let probes = match slot {
            Slot::Main(i) => {
                Some(tokio::spawn(self.clone().probe_loop(c.clone(), i, launch.ip, kill.clone())))
            }
            Slot::Init(_) => None,
        };
        let mut stop = self.stop.clone();
        let status = tokio::select! {
            s = child.wait() => s?,
            _ = async { let _ = stop.wait_for(|s| s.is_some()).await; } => {
                let grace = (*self.stop.borrow()).unwrap_or(0);
                self.terminate(c, &running, launch.ip, grace, &mut child).await?
            }
            _ = kill.notified() => {
                tracing::info!(pod = %self.name(), container = %c.name, "liveness failed: restarting");
                let grace = self.pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds).unwrap_or(30);
                self.terminate(c, &running, launch.ip, grace, &mut child).await?
            }
        };
        if let Some(p) = probes {
            p.abort();
        }
        // The session may hold children the leader left behind.
        spawn::signal_group(pid, libc::SIGKILL);
        use std::os::unix::process::ExitStatusExt;
        let code = status.code();
        let signal = status.signal();
        let exit = code.unwrap_or(128 + signal.unwrap_or(9));
        tracing::info!(pod = %self.name(), container = %c.name, exit, "exited");
        let _ = append(&log, &format!("--- container exited: code {exit} at {} ---\n", now()));
        self.update_c(slot, |cs| {
            cs.ready = false;
            cs.started = false;
            cs.pid = None;
            cs.phase = Phase::Terminated {
                code: exit,
                signal,
                reason: if exit == 0 { "Completed".into() } else { "Error".into() },
                started: started_at,
                finished: now(),
            };
        });
        Ok(Some(exit))
    }

    /// preStop, then SIGTERM to the container's session, SIGKILL when the grace is over.
    async fn terminate(
        &self,
        c: &Container,
        running: &Running,
        ip: Ipv4Addr,
        grace: i64,
        child: &mut tokio::process::Child,
    ) -> Result<std::process::ExitStatus> {
        let deadline = Instant::now() + Duration::from_secs(grace.max(0) as u64);
        if grace > 0
            && let Some(h) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref())
        {
            tracing::info!(pod = %self.name(), container = %c.name, "preStop");
            let _ = tokio::time::timeout_at(deadline.into(), self.run_handler(h, c, ip)).await;
        }
        spawn::signal_group(running.pid, libc::SIGTERM);
        // At least 2 s after SIGTERM, as the kubelet grants after a preStop that used the grace.
        let until = deadline.max(Instant::now() + Duration::from_secs(if grace > 0 { 2 } else { 0 }));
        match tokio::time::timeout_at(until.into(), child.wait()).await {
            Ok(s) => Ok(s?),
            Err(_) => {
                tracing::info!(pod = %self.name(), container = %c.name, "grace period over: SIGKILL");
                spawn::signal_group(running.pid, libc::SIGKILL);
                Ok(child.wait().await?)
            }
        }
    }

    async fn run_handler(&self, h: &LifecycleHandler, c: &Container, ip: Ipv4Addr) {
        if let Some(s) = &h.sleep {
            tokio::time::sleep(Duration::from_secs(s.seconds.max(0) as u64)).await;
        } else if let Some(g) = &h.http_get {
            let port = resolve_port(&g.port, c).unwrap_or(80);
            let host = g.host.clone().unwrap_or_else(|| ip.to_string());
            let _ = http_get(&host, port, g.path.as_deref().unwrap_or("/"), Duration::from_secs(30)).await;
        } else if h.exec.is_some() {
            tracing::warn!(pod = %self.name(), container = %c.name, "exec preStop hooks are not run by the test node");
        }
    }

    async fn probe_loop(self: Arc<Self>, c: Container, index: usize, ip: Ipv4Addr, kill: Arc<Notify>) {
        let begun = Instant::now();
        if let Some(p) = &c.startup_probe {
            let mut failures = 0;
            tokio::time::sleep(secs(p.initial_delay_seconds, 0)).await;
            loop {
                if probe(p, &c, ip).await {
                    break;
                }
                failures += 1;
                if failures >= p.failure_threshold.unwrap_or(3) {
                    kill.notify_one();
                    return;
                }
                tokio::time::sleep(secs(p.period_seconds, 10)).await;
            }
        }
        self.update(|s| {
            s.containers[index].started = true;
            if c.readiness_probe.is_none() {
                s.containers[index].ready = true;
            }
        });
        let mut next_ready = c.readiness_probe.as_ref().map(|p| begun + secs(p.initial_delay_seconds, 0));
        let mut next_live = c.liveness_probe.as_ref().map(|p| begun + secs(p.initial_delay_seconds, 0));
        let (mut r_fail, mut r_ok, mut l_fail) = (0, 0, 0);
        loop {
            let next = [next_ready, next_live].into_iter().flatten().min();
            let Some(next) = next else { return };
            tokio::time::sleep_until(next.into()).await;
            if let (Some(t), Some(p)) = (next_ready, &c.readiness_probe)
                && t <= Instant::now()
            {
                if probe(p, &c, ip).await {
                    r_fail = 0;
                    r_ok += 1;
                    if r_ok >= p.success_threshold.unwrap_or(1) {
                        self.set_ready(index, true);
                    }
                } else {
                    r_ok = 0;
                    r_fail += 1;
                    if r_fail >= p.failure_threshold.unwrap_or(3) {
                        self.set_ready(index, false);
                    }
                }
                next_ready = Some(Instant::now() + secs(p.period_seconds, 10));
            }
            if let (Some(t), Some(p)) = (next_live, &c.liveness_probe)
                && t <= Instant::now()
            {
                if probe(p, &c, ip).await {
                    l_fail = 0;
                } else {
                    l_fail += 1;
                    if l_fail >= p.failure_threshold.unwrap_or(3) {
                        kill.notify_one();
                        return;
                    }
                }
                next_live = Some(Instant::now() + secs(p.period_seconds, 10));
            }
        }
    }

    fn set_ready(&self, index: usize, ready: bool) {
        let changed = self.with_state(|s| s.containers[index].ready != ready);
        if changed {
            self.update(|s| s.containers[index].ready = ready);
        }
    }

    async fn publish_status(self: Arc<Self>) {
        loop {
            self.changed.notified().await;
            // Coalesce a burst of changes into one write.
            tokio::time::sleep(Duration::from_millis(100)).await;
            self.publish_once().await;
        }
    }

    async fn publish_once(&self) {
        let status = self.with_state(|s| self.status_json(s));
        let name = self.pod.metadata.name.clone().unwrap_or_default();
        let patch = json!({"status": status});
        match self.api.patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch)).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => tracing::warn!(pod = %self.name(), "status: {e}"),
        }
    }

    fn status_json(&self, s: &PodState) -> Value {
        let all_ready = s.containers.iter().all(|c| c.ready);
        let any_running = s.containers.iter().any(|c| matches!(c.phase, Phase::Running { .. }));
        let phase = match s.phase {
            "Pending" if s.initialized && any_running => "Running",
            p => p,
        };
        let terminal = phase == "Succeeded" || phase == "Failed";
        let ready = all_ready && phase == "Running" && self.stopping().is_none();
        let cond = |t: &str, v: bool| json!({"type": t, "status": if v { "True" } else { "False" }, "lastTransitionTime": now()});
        let mut st = json!({
            "phase": phase,
            "hostIP": self.ctx.bridge.gateway.to_string(),
            "hostIPs": [{"ip": self.ctx.bridge.gateway.to_string()}],
            "startTime": s.start_time,
            "conditions": [
                cond("PodReadyToStartContainers", s.ip.is_some() && !terminal),
                cond("Initialized", s.initialized),
                cond("ContainersReady", ready),
                cond("Ready", ready),
            ],
            "containerStatuses": s.containers.iter().map(CStatus::json).collect::<Vec<_>>(),
        });
        if !s.init.is_empty() {
            st["initContainerStatuses"] = Value::Array(s.init.iter().map(CStatus::json).collect());
        }
        if let Some(ip) = s.ip {
            st["podIP"] = json!(ip.to_string());
            st["podIPs"] = json!([{"ip": ip.to_string()}]);
        }
        if let Some(m) = &s.message {
            st["message"] = json!(m);
        }
        st
    }
}

#[derive(Clone, Copy)]
enum Slot {
    Init(usize),
    Main(usize),
}

struct Launch {
    vols: volumes::PodVolumes,
    hosts_file: PathBuf,
    resolv_conf: PathBuf,
    hostname: String,
    net_path: PathBuf,
    ip: Ipv4Addr,
    base_env: Vec<(String, String)>,
}

fn secs(v: Option<i32>, default: i32) -> Duration {
    Duration::from_secs(v.unwrap_or(default).max(if default > 0 { 1 } else { 0 }) as u64)
}

fn which(cmd: &str) -> String {
    if cmd.contains('/') {
        return cmd.to_string();
    }
    for dir in ["/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"] {
        let p = format!("{dir}/{cmd}");
        if std::path::Path::new(&p).exists() {
            return p;
        }
    }
    cmd.to_string()
}

fn append(path: &std::path::Path, line: &str) -> std::io::Result<()> {
    use std::io::Write;
    std::fs::OpenOptions::new().append(true).create(true).open(path)?.write_all(line.as_bytes())
}

fn resolve_port(port: &IntOrString, c: &Container) -> Option<u16> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).ok(),
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .or_else(|| name.parse().ok()),
    }
}

/// One probe attempt: HTTP GET (2xx/3xx), TCP connect; exec and gRPC probes count as
/// failed, with a warning, since this node does not run them.
async fn probe(p: &Probe, c: &Container, ip: Ipv4Addr) -> bool {
    let timeout = secs(p.timeout_seconds, 1);
    if let Some(g) = &p.http_get {
        let Some(port) = resolve_port(&g.port, c) else { return false };
        let host = g.host.clone().unwrap_or_else(|| ip.to_string());
        matches!(http_get(&host, port, g.path.as_deref().unwrap_or("/"), timeout).await, Ok(code) if (200..400).contains(&code))
    } else if let Some(t) = &p.tcp_socket {
        let Some(port) = resolve_port(&t.port, c) else { return false };
        let host = t.host.clone().unwrap_or_else(|| ip.to_string());
        matches!(
            tokio::time::timeout(timeout, tokio::net::TcpStream::connect((host.as_str(), port))).await,
            Ok(Ok(_))
        )
    } else {
        tracing::warn!(container = %c.name, "probe kind not supported by the test node");
        false
    }
}

async fn http_get(host: &str, port: u16, path: &str, timeout: Duration) -> Result<u16> {
    tokio::time::timeout(timeout, async {
        let mut s = tokio::net::TcpStream::connect((host, port)).await?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/1.36\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await?;
        let mut buf = vec![0u8; 256];
        let mut n = 0;
        while n < 12 {
            let r = s.read(&mut buf[n..]).await?;
            if r == 0 {
                break;
            }
            n += r;
        }
        let line = String::from_utf8_lossy(&buf[..n]);
        line.split_whitespace().nth(1).and_then(|c| c.parse::<u16>().ok()).context("no HTTP status line")
    })
    .await
    .context("timed out")?
}

/// What the node keeps per Pod it runs.
pub struct Handle {
    pub stop: watch::Sender<Option<i64>>,
    pub done: bool,
}
