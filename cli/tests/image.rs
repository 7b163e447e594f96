//! The two builds of the image agree: the Dockerfile (for machines that reach the
//! public registries) and `scripts/image-build.sh` (Debian's packages with buildah,
//! offline) give the same user, entrypoint, command, ports, environment and data
//! directory. The script's configuration is what `--print-config` prints; when
//! `MAILCLUSTER_TEST_IMAGE` names an OCI archive the script built (scripts/test.sh
//! sets it as root), the configuration inside that archive is checked too, with the
//! data directory's owner in its layer.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// What the Dockerfile's runtime stage declares. Its base (distroless) sets PATH,
/// the script sets the same one itself.
#[derive(Debug, Default)]
struct Declared {
    user: String,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    ports: BTreeSet<String>,
    env: BTreeSet<String>,
    data_dir: String,
}

fn json_list(text: &str) -> Vec<String> {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not an exec-form list: {text}: {e}"))
}

fn dockerfile() -> Declared {
    let text = std::fs::read_to_string(root().join("Dockerfile")).expect("read Dockerfile");
    // The last stage is the image; joined continuation lines.
    let text = text.replace("\\\n", " ");
    let last = text.rsplit("\nFROM ").next().expect("a FROM line");
    let mut d = Declared::default();
    for line in last.lines().map(str::trim) {
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        match word {
            "USER" => d.user = rest.trim().to_string(),
            "ENTRYPOINT" => d.entrypoint = json_list(rest),
            "CMD" => d.cmd = json_list(rest),
            "EXPOSE" => d.ports.extend(rest.split_whitespace().map(|p| format!("{p}/tcp"))),
            "ENV" => {
                d.env.insert(rest.trim().to_string());
            }
            "COPY" if rest.contains("--chown=65532:65532") => {
                d.data_dir = rest.split_whitespace().last().unwrap_or_default().to_string();
            }
            _ => {}
        }
    }
    d.env.insert("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    d
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap_or_default().to_string()).collect())
        .unwrap_or_default()
}

fn check(d: &Declared, user: &Value, entrypoint: &Value, cmd: &Value, ports: BTreeSet<String>, env: &Value) {
    assert_eq!(user.as_str(), Some(d.user.as_str()), "user");
    assert_eq!(strings(entrypoint), d.entrypoint, "entrypoint");
    assert_eq!(strings(cmd), d.cmd, "command");
    assert_eq!(ports, d.ports, "exposed ports");
    assert_eq!(strings(env).into_iter().collect::<BTreeSet<_>>(), d.env, "environment");
}

#[test]
fn the_dockerfile_and_the_offline_build_give_the_same_image_configuration() {
    let d = dockerfile();
    assert_eq!(d.user, "65532:65532", "the UID the operator's security contexts expect");
    assert!(!d.entrypoint.is_empty() && !d.ports.is_empty() && !d.data_dir.is_empty(), "{d:?}");
    let out = Command::new(root().join("scripts/image-build.sh"))
        .arg("--print-config")
        .output()
        .expect("run scripts/image-build.sh --print-config");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let c: Value = serde_json::from_slice(&out.stdout).expect("JSON configuration");
    let ports = strings(&c["ExposedPorts"]).into_iter().collect();
    check(&d, &c["User"], &c["Entrypoint"], &c["Cmd"], ports, &c["Env"]);
    assert_eq!(c["DataDir"].as_str(), Some(d.data_dir.as_str()), "data directory");
}

/// A member of the OCI archive (a tar file) as bytes.
fn member(archive: &Path, name: &str) -> Vec<u8> {
    let out = Command::new("tar").arg("-xOf").arg(archive).arg(name).output().expect("run tar");
    assert!(
        out.status.success(),
        "{name} in {}: {}",
        archive.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn blob(archive: &Path, digest: &str) -> Vec<u8> {
    member(archive, &format!("blobs/sha256/{}", digest.trim_start_matches("sha256:")))
}

#[test]
fn the_built_image_carries_the_dockerfiles_configuration() {
    let Ok(archive) = std::env::var("MAILCLUSTER_TEST_IMAGE") else {
        eprintln!("skipped: MAILCLUSTER_TEST_IMAGE names no image archive (scripts/test.sh sets it as root)");
        return;
    };
    let archive = PathBuf::from(archive);
    let d = dockerfile();
    let index: Value = serde_json::from_slice(&member(&archive, "index.json")).expect("index.json");
    let manifest: Value = serde_json::from_slice(&blob(
        &archive,
        index["manifests"][0]["digest"].as_str().expect("manifest digest"),
    ))
    .expect("manifest");
    let config: Value = serde_json::from_slice(&blob(
        &archive,
        manifest["config"]["digest"].as_str().expect("config digest"),
    ))
    .expect("image configuration");
    let c = &config["config"];
    let ports = c["ExposedPorts"].as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default();
    check(&d, &c["User"], &c["Entrypoint"], &c["Cmd"], ports, &c["Env"]);
    assert_eq!(config["os"], "linux");

    // The data directory belongs to 65532 in the layer, as the Dockerfile's COPY --chown makes it.
    let layer = manifest["layers"][0]["digest"].as_str().expect("a layer").trim_start_matches("sha256:");
    let listing = Command::new("sh")
        .arg("-c")
        .arg(format!("tar -xOf \"$0\" blobs/sha256/{layer} | tar -tzvf - --numeric-owner"))
        .arg(&archive)
        .output()
        .expect("list the layer");
    assert!(listing.status.success(), "{}", String::from_utf8_lossy(&listing.stderr));
    let listing = String::from_utf8_lossy(&listing.stdout);
    let data = d.data_dir.trim_start_matches('/').trim_end_matches('/');
    // A member's name, without the "./" some tar writers put first.
    let name = |l: &str| {
        l.split_whitespace()
            .last()
            .unwrap_or_default()
            .trim_start_matches("./")
            .trim_end_matches('/')
            .to_string()
    };
    let entry = listing
        .lines()
        .find(|l| name(l) == data)
        .unwrap_or_else(|| panic!("no {data} in the layer:\n{listing}"));
    assert!(entry.contains(" 65532/65532 "), "{data} is not 65532's: {entry}");
    let entrypoint = d.entrypoint[0].trim_start_matches('/');
    assert!(
        listing.lines().any(|l| name(l) == entrypoint && l.starts_with("-rwxr-xr-x 0/0 ")),
        "no root-owned executable {entrypoint} in the layer"
    );
}
