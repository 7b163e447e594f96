//! The node's network: a Linux bridge whose address is the node's (and every Pod's
//! gateway), and per Pod a network namespace joined to the bridge by a veth pair.
//! Everything is made with iproute2, the way a CNI bridge plugin does it.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Names of the network namespaces this node makes; what is left of them after a
/// crash is removed at start.
pub const NETNS_PREFIX: &str = "mcpod-";

pub struct Bridge {
    pub name: String,
    pub gateway: Ipv4Addr,
    pub prefix: u8,
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip").args(args).output().context("run ip (iproute2)")?;
    if !out.status.success() {
        bail!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

fn sysctl(path: &str, value: &str) -> Result<()> {
    std::fs::write(path, value).with_context(|| format!("write {path}"))
}

impl Bridge {
    /// Makes the bridge (or finds it) and turns on what Service traffic needs:
    /// forwarding between Pods and the host, and bridged packets through iptables
    /// so kube-proxy's DNAT is undone on replies between Pods on the same bridge.
    pub fn ensure(&self) -> Result<()> {
        if !PathBuf::from(format!("/sys/class/net/{}", self.name)).exists() {
            ip(&["link", "add", &self.name, "type", "bridge"])?;
        }
        let cidr = format!("{}/{}", self.gateway, self.prefix);
        let addrs = Command::new("ip").args(["-4", "addr", "show", "dev", &self.name]).output()?;
        if !String::from_utf8_lossy(&addrs.stdout).contains(&cidr) {
            ip(&["addr", "add", &cidr, "dev", &self.name])?;
        }
        ip(&["link", "set", &self.name, "up"])?;
        sysctl("/proc/sys/net/ipv4/ip_forward", "1")?;
        // Without br_netfilter loaded the file is missing; Service traffic between
        // two Pods of this node then fails, which the end-to-end test shows.
        let _ = sysctl("/proc/sys/net/bridge/bridge-nf-call-iptables", "1");
        Ok(())
    }

    /// Removes network namespaces a previous run of the node left behind.
    pub fn clean_leftovers(&self) {
        if let Ok(dir) = std::fs::read_dir("/run/netns") {
            for e in dir.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(NETNS_PREFIX) {
                    let _ = ip(&["netns", "del", &name]);
                }
            }
        }
    }
}

/// Pod addresses: the bridge's subnet without the network, gateway and broadcast
/// addresses.
pub struct Ipam {
    base: u32,
    size: u32,
    gateway: u32,
    used: BTreeSet<u32>,
}

impl Ipam {
    pub fn new(bridge: &Bridge) -> Self {
        let mask = if bridge.prefix == 0 { 0 } else { u32::MAX << (32 - bridge.prefix) };
        let gw = u32::from(bridge.gateway);
        Ipam { base: gw & mask, size: !mask, gateway: gw, used: BTreeSet::new() }
    }

    pub fn allocate(&mut self) -> Option<Ipv4Addr> {
        (1..self.size).map(|o| self.base + o).find(|a| *a != self.gateway && !self.used.contains(a)).map(
            |a| {
                self.used.insert(a);
                Ipv4Addr::from(a)
            },
        )
    }

    pub fn release(&mut self, a: Ipv4Addr) {
        self.used.remove(&u32::from(a));
    }
}

pub struct PodNet {
    pub netns: String,
    pub veth: String,
    pub ip: Ipv4Addr,
}

impl PodNet {
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.netns))
    }

    /// `key` is unique per Pod (its uid); interface names are cut to the kernel's 15 bytes.
    pub fn create(bridge: &Bridge, key: &str, ip_addr: Ipv4Addr) -> Result<PodNet> {
        let short: String = key.chars().filter(|c| c.is_ascii_alphanumeric()).take(10).collect();
        let net =
            PodNet { netns: format!("{NETNS_PREFIX}{short}"), veth: format!("mcv{short}"), ip: ip_addr };
        net.destroy();
        ip(&["netns", "add", &net.netns])?;
        let made = (|| {
            ip(&["link", "add", &net.veth, "type", "veth", "peer", "name", "eth0", "netns", &net.netns])?;
            ip(&["link", "set", &net.veth, "master", &bridge.name])?;
            // Hairpin: a Pod reaching itself through its Service's address.
            ip(&["link", "set", &net.veth, "type", "bridge_slave", "hairpin", "on"])?;
            ip(&["link", "set", &net.veth, "up"])?;
            let cidr = format!("{}/{}", ip_addr, bridge.prefix);
            ip(&["-n", &net.netns, "addr", "add", &cidr, "dev", "eth0"])?;
            ip(&["-n", &net.netns, "link", "set", "lo", "up"])?;
            ip(&["-n", &net.netns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &net.netns, "route", "add", "default", "via", &bridge.gateway.to_string()])
        })();
        if let Err(e) = made {
            net.destroy();
            return Err(e);
        }
        Ok(net)
    }

    pub fn destroy(&self) {
        let _ = ip(&["netns", "del", &self.netns]);
        let _ = ip(&["link", "del", &self.veth]);
    }
}
