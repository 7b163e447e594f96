//! A Pod's volumes as directories under the node's state directory, and its
//! containers' environment: what the kubelet's volume manager and env expansion do,
//! for the volume and value kinds Pods of this project (and most Pods) use.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, DownwardAPIVolumeFile, KeyToPath, ObjectFieldSelector, Pod, Secret, ServiceAccount,
};
use kube::api::PostParams;
use kube::{Api, Client};

pub struct PodVolumes {
    pub dirs: BTreeMap<String, PathBuf>,
}

fn write_file(dir: &Path, rel: &str, data: &[u8], mode: i32) -> Result<()> {
    if rel.split('/').any(|c| c == ".." || c.is_empty()) {
        bail!("volume path {rel:?} leaves its volume");
    }
    let path = dir.join(rel);
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p)?;
    }
    std::fs::write(&path, data).with_context(|| format!("write {}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode as u32))?;
    Ok(())
}

/// Items of a ConfigMap or Secret: the listed keys at their paths, or every key.
fn write_items(
    dir: &Path,
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&Vec<KeyToPath>>,
    default_mode: i32,
    optional: bool,
) -> Result<()> {
    match items {
        Some(items) => {
            for it in items {
                match data.get(&it.key) {
                    Some(v) => write_file(dir, &it.path, v, it.mode.unwrap_or(default_mode))?,
                    None if optional => {}
                    None => bail!("key {} is missing", it.key),
                }
            }
        }
        None => {
            for (k, v) in data {
                write_file(dir, k, v, default_mode)?;
            }
        }
    }
    Ok(())
}

async fn config_map_data(client: &Client, ns: &str, name: &str) -> Result<Option<BTreeMap<String, Vec<u8>>>> {
    let Some(cm) = Api::<ConfigMap>::namespaced(client.clone(), ns).get_opt(name).await? else {
        return Ok(None);
    };
    let mut out: BTreeMap<String, Vec<u8>> =
        cm.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.into_bytes())).collect();
    out.extend(cm.binary_data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)));
    Ok(Some(out))
}

async fn secret_data(client: &Client, ns: &str, name: &str) -> Result<Option<BTreeMap<String, Vec<u8>>>> {
    let Some(s) = Api::<Secret>::namespaced(client.clone(), ns).get_opt(name).await? else {
        return Ok(None);
    };
    let mut out: BTreeMap<String, Vec<u8>> =
        s.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect();
    out.extend(s.string_data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.into_bytes())));
    Ok(Some(out))
}

/// `metadata.name`, `metadata.labels['app']`, `status.podIP`, ... of a Pod.
pub fn field_value(pod: &Pod, f: &ObjectFieldSelector, pod_ip: &str, host_ip: &str) -> Result<String> {
    let m = &pod.metadata;
    let spec = pod.spec.as_ref();
    let path = f.field_path.as_str();
    let keyed = |prefix: &str, map: &Option<BTreeMap<String, String>>| -> Option<String> {
        let key = path.strip_prefix(prefix)?.strip_prefix("['")?.strip_suffix("']")?;
        Some(map.as_ref().and_then(|m| m.get(key)).cloned().unwrap_or_default())
    };
    let all = |map: &Option<BTreeMap<String, String>>| {
        map.as_ref()
            .map(|m| m.iter().map(|(k, v)| format!("{k}={v:?}\n")).collect::<String>())
            .unwrap_or_default()
    };
    Ok(match path {
        "metadata.name" => m.name.clone().unwrap_or_default(),
        "metadata.namespace" => m.namespace.clone().unwrap_or_default(),
        "metadata.uid" => m.uid.clone().unwrap_or_default(),
        "metadata.labels" => all(&m.labels),
        "metadata.annotations" => all(&m.annotations),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()).unwrap_or_default(),
        "status.podIP" | "status.podIPs" => pod_ip.to_string(),
        "status.hostIP" | "status.hostIPs" => host_ip.to_string(),
        _ => keyed("metadata.labels", &m.labels)
            .or_else(|| keyed("metadata.annotations", &m.annotations))
            .ok_or_else(|| anyhow!("field {path} is not supported by the test node"))?,
    })
}

fn downward_files(
    dir: &Path,
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    mode: i32,
    pod_ip: &str,
) -> Result<()> {
    for it in items {
        if let Some(f) = &it.field_ref {
            let v = field_value(pod, f, pod_ip, "")?;
            write_file(dir, &it.path, v.as_bytes(), it.mode.unwrap_or(mode))?;
        } else {
            bail!("downwardAPI item {}: only fieldRef is supported by the test node", it.path);
        }
    }
    Ok(())
}

/// Writes every volume of `pod` under `root` (one directory per volume).
pub async fn materialize(client: &Client, pod: &Pod, root: &Path, pod_ip: &str) -> Result<PodVolumes> {
    let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let spec = pod.spec.as_ref().ok_or_else(|| anyhow!("pod without spec"))?;
    let mut dirs = BTreeMap::new();
    for v in spec.volumes.iter().flatten() {
        let dir = root.join(&v.name);
        std::fs::create_dir_all(&dir)?;
        if let Some(cm) = &v.config_map {
            let mode = cm.default_mode.unwrap_or(0o644);
            match config_map_data(client, &ns, &cm.name).await? {
                Some(d) => write_items(&dir, &d, cm.items.as_ref(), mode, cm.optional == Some(true))?,
                None if cm.optional == Some(true) => {}
                None => bail!("configmap {} not found", cm.name),
            }
        } else if let Some(s) = &v.secret {
            let name = s.secret_name.clone().unwrap_or_default();
            let mode = s.default_mode.unwrap_or(0o644);
            match secret_data(client, &ns, &name).await? {
                Some(d) => write_items(&dir, &d, s.items.as_ref(), mode, s.optional == Some(true))?,
                None if s.optional == Some(true) => {}
                None => bail!("secret {name} not found"),
            }
        } else if v.empty_dir.is_some() {
            // Any user of the Pod may write: the kubelet makes emptyDir 0777 too.
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))?;
        } else if let Some(d) = &v.downward_api {
            downward_files(
                &dir,
                pod,
                d.items.as_deref().unwrap_or_default(),
                d.default_mode.unwrap_or(0o644),
                pod_ip,
            )?;
        } else if let Some(p) = &v.projected {
            let mode = p.default_mode.unwrap_or(0o644);
            for src in p.sources.iter().flatten() {
                if let Some(t) = &src.service_account_token {
                    let token =
                        service_account_token(client, pod, &ns, t.audience.clone(), t.expiration_seconds)
                            .await?;
                    write_file(&dir, &t.path, token.as_bytes(), mode)?;
                } else if let Some(cm) = &src.config_map {
                    match config_map_data(client, &ns, &cm.name).await? {
                        Some(d) => write_items(&dir, &d, cm.items.as_ref(), mode, cm.optional == Some(true))?,
                        None if cm.optional == Some(true) => {}
                        None => bail!("configmap {} not found", cm.name),
                    }
                } else if let Some(s) = &src.secret {
                    match secret_data(client, &ns, &s.name).await? {
                        Some(d) => write_items(&dir, &d, s.items.as_ref(), mode, s.optional == Some(true))?,
                        None if s.optional == Some(true) => {}
                        None => bail!("secret {} not found", s.name),
                    }
                } else if let Some(d) = &src.downward_api {
                    downward_files(&dir, pod, d.items.as_deref().unwrap_or_default(), mode, pod_ip)?;
                }
            }
        } else if let Some(h) = &v.host_path {
            dirs.insert(v.name.clone(), PathBuf::from(&h.path));
            continue;
        } else {
            bail!("volume {}: kind not supported by the test node", v.name);
        }
        dirs.insert(v.name.clone(), dir);
    }
    Ok(PodVolumes { dirs })
}

/// A token bound to the Pod, as the kubelet requests it: it stops being valid when
/// the Pod is deleted.
async fn service_account_token(
    client: &Client,
    pod: &Pod,
    ns: &str,
    audience: Option<String>,
    expiration: Option<i64>,
) -> Result<String> {
    let sa =
        pod.spec.as_ref().and_then(|s| s.service_account_name.clone()).unwrap_or_else(|| "default".into());
    let req = TokenRequest {
        spec: TokenRequestSpec {
            audiences: audience.into_iter().collect(),
            expiration_seconds: expiration,
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
        },
        ..Default::default()
    };
    let out = Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request(&sa, &PostParams::default(), &req)
        .await
        .with_context(|| format!("token for service account {ns}/{sa}"))?;
    out.status.map(|s| s.token).ok_or_else(|| anyhow!("token request without a token"))
}

/// `$(NAME)` references to variables defined earlier; `$$` escapes a `$`.
pub fn expand(s: &str, env: &[(String, String)]) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(a) = after.strip_prefix('$') {
            out.push('$');
            rest = a;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
        {
            let name = &inner[..end];
            match env.iter().rev().find(|(k, _)| k == name) {
                Some((_, v)) => out.push_str(v),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The container's environment in the kubelet's order: the Service variables of the
/// API server, `envFrom`, then `env` (later entries win; `$(VAR)` sees earlier ones).
pub async fn container_env(
    client: &Client,
    pod: &Pod,
    c: &Container,
    base: Vec<(String, String)>,
    pod_ip: &str,
    host_ip: &str,
) -> Result<Vec<(String, String)>> {
    let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let mut env = base;
    let set = |env: &mut Vec<(String, String)>, k: String, v: String| {
        env.retain(|(n, _)| *n != k);
        env.push((k, v));
    };
    for from in c.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let data = if let Some(r) = &from.config_map_ref {
            (config_map_data(client, &ns, &r.name).await?, r.optional == Some(true), &r.name)
        } else if let Some(r) = &from.secret_ref {
            (secret_data(client, &ns, &r.name).await?, r.optional == Some(true), &r.name)
        } else {
            continue;
        };
        match data {
            (Some(d), _, _) => {
                for (k, v) in d {
                    set(&mut env, format!("{prefix}{k}"), String::from_utf8_lossy(&v).into_owned());
                }
            }
            (None, true, _) => {}
            (None, false, name) => bail!("envFrom {name} not found"),
        }
    }
    for e in c.env.iter().flatten() {
        let value = if let Some(v) = &e.value {
            expand(v, &env)
        } else if let Some(src) = &e.value_from {
            if let Some(f) = &src.field_ref {
                field_value(pod, f, pod_ip, host_ip)?
            } else if let Some(r) = &src.secret_key_ref {
                let d = secret_data(client, &ns, &r.name).await?;
                match d.and_then(|d| d.get(&r.key).cloned()) {
                    Some(v) => String::from_utf8_lossy(&v).into_owned(),
                    None if r.optional == Some(true) => continue,
                    None => bail!("env {}: secret {} has no key {}", e.name, r.name, r.key),
                }
            } else if let Some(r) = &src.config_map_key_ref {
                let d = config_map_data(client, &ns, &r.name).await?;
                match d.and_then(|d| d.get(&r.key).cloned()) {
                    Some(v) => String::from_utf8_lossy(&v).into_owned(),
                    None if r.optional == Some(true) => continue,
                    None => bail!("env {}: configmap {} has no key {}", e.name, r.name, r.key),
                }
            } else if let Some(r) = &src.resource_field_ref {
                resource_value(c, &r.resource)
            } else {
                continue;
            }
        } else {
            String::new()
        };
        set(&mut env, e.name.clone(), value);
    }
    Ok(env)
}

/// `limits.memory` in bytes, `requests.cpu` in whole cores (rounded up), as the
/// kubelet writes them; a missing limit is the node's allocatable, here 0 = unknown.
fn resource_value(c: &Container, resource: &str) -> String {
    let (kind, name) = resource.split_once('.').unwrap_or(("", resource));
    let r = c.resources.as_ref();
    let q = match kind {
        "limits" => r.and_then(|r| r.limits.as_ref()).and_then(|m| m.get(name)),
        _ => r.and_then(|r| r.requests.as_ref()).and_then(|m| m.get(name)),
    };
    let Some(q) = q else { return "0".into() };
    let s = q.0.as_str();
    let units: [(&str, f64); 8] = [
        ("Ki", 1024.0),
        ("Mi", 1024.0 * 1024.0),
        ("Gi", 1024.0 * 1024.0 * 1024.0),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("m", 1e-3),
        ("", 1.0),
    ];
    for (suffix, mult) in units {
        if let Some(n) = s.strip_suffix(suffix).and_then(|n| n.parse::<f64>().ok()) {
            return format!("{}", (n * mult).ceil() as u64);
        }
    }
    s.to_string()
}

#[cfg(test)]
mod tests {
    use super::expand;

    #[test]
    fn expands_defined_references_and_keeps_the_rest() {
        let env = vec![("A".to_string(), "1".to_string()), ("B".to_string(), "x$(A)".to_string())];
        assert_eq!(expand("$(A)-$(B)", &env), "1-x$(A)");
        assert_eq!(expand("$(MISSING)", &env), "$(MISSING)");
        assert_eq!(expand("$$(A) $5 $(", &env), "$(A) $5 $(");
    }
}
