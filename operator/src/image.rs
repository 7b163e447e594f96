//! Which container images a `MailCluster` may run.
//!
//! Whoever may edit a MailCluster chooses the image its pods, migration Job and
//! stress Jobs run, with the database and Redis URLs and the cluster's keys in
//! their environment. The operator therefore runs only images from repositories
//! it was told to trust (`--allowed-images`; default: the project's own), and a
//! MailCluster asking for another image gets nothing created or changed.
//!
//! Matching is by repository, after parsing the reference the way a container
//! runtime does (`[registry[:port]/]path[:tag][@digest]`), never by string
//! prefix: `ghcr.io/mailcluster/mailcluster` allows
//! `ghcr.io/mailcluster/mailcluster:1.2` and `…@sha256:…`, not
//! `ghcr.io/mailcluster/mailcluster-evil` nor `ghcr.io:8443/mailcluster/mailcluster`.
//! An entry ending in `/` allows every repository below that path
//! (`registry.example.com/mail/`). A reference that does not parse is refused.

use std::fmt;

/// The repository the operator trusts unless told otherwise: its own image.
pub const DEFAULT_ALLOWED_IMAGES: &str = "ghcr.io/mailcluster/mailcluster";

/// Docker Hub, as references without a registry mean it.
const DOCKER_HUB: &str = "docker.io";

/// A parsed image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// `registry/path`, registry lower-cased, Docker Hub spelled out
    /// (`alpine` → `docker.io/library/alpine`).
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<String>,
}

/// Parses `[registry[:port]/]path[:tag][@algorithm:hex]` (the distribution
/// reference grammar).
pub fn parse_reference(image: &str) -> Result<ImageRef, String> {
    let (name_tag, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    if let Some(d) = digest {
        check_digest(d)?;
    }
    // A ':' after the last '/' starts the tag; one before it is a registry port.
    let last_slash = name_tag.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match name_tag[last_slash..].find(':') {
        Some(i) => (&name_tag[..last_slash + i], Some(&name_tag[last_slash + i + 1..])),
        None => (name_tag, None),
    };
    if let Some(t) = tag {
        check_tag(t)?;
    }
    let repository = normalize_name(name, true)?;
    Ok(ImageRef { repository, tag: tag.map(String::from), digest: digest.map(String::from) })
}

/// `registry/path`, checked and normalized; `library` is added to one-part
/// Docker Hub paths when `official` (whole repositories, not path prefixes).
fn normalize_name(name: &str, official: bool) -> Result<String, String> {
    if name.is_empty() || name.len() > 255 {
        return Err(format!("repository name {name:?} is empty or longer than 255 characters"));
    }
    let (registry, path) = match name.split_once('/') {
        Some((first, rest)) if is_registry(first) => (first.to_ascii_lowercase(), rest),
        _ => (DOCKER_HUB.to_string(), name),
    };
    check_registry(&registry)?;
    let registry = if registry == "index.docker.io" { DOCKER_HUB.to_string() } else { registry };
    for component in path.split('/') {
        check_path_component(component)
            .map_err(|why| format!("repository path {path:?}: component {component:?} {why}"))?;
    }
    if registry == DOCKER_HUB && official && !path.contains('/') {
        return Ok(format!("{registry}/library/{path}"));
    }
    Ok(format!("{registry}/{path}"))
}

/// The first component names a registry when it could not be a path
/// component: it has a dot or a port, is `localhost`, or has capitals.
fn is_registry(first: &str) -> bool {
    first.contains(['.', ':']) || first == "localhost" || first.chars().any(|c| c.is_ascii_uppercase())
}

fn check_registry(registry: &str) -> Result<(), String> {
    let (host, port) = match registry.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (registry, None),
    };
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if !host.split('.').all(label_ok) {
        return Err(format!("registry {registry:?} is not a host name"));
    }
    if let Some(p) = port
        && !(p.len() <= 5 && p.chars().all(|c| c.is_ascii_digit()) && p.parse::<u16>().is_ok_and(|n| n > 0))
    {
        return Err(format!("registry {registry:?} has no valid port"));
    }
    Ok(())
}

/// `[a-z0-9]+` joined by `.`, `_`, `__` or runs of `-`.
fn check_path_component(c: &str) -> Result<(), &'static str> {
    let bytes = c.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if bytes.is_empty() || !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return Err("must start and end with a lower-case letter or digit");
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|b| b == b'-');
        if !ok {
            return Err("has a character or separator a repository name may not have");
        }
    }
    Ok(())
}

/// `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
fn check_tag(tag: &str) -> Result<(), String> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut chars = tag.chars();
    let ok =
        tag.len() <= 128 && chars.next().is_some_and(word) && chars.all(|c| word(c) || c == '.' || c == '-');
    if ok { Ok(()) } else { Err(format!("tag {tag:?} is not a valid tag")) }
}

/// `algorithm:hex`, e.g. `sha256:` and 64 hex digits.
fn check_digest(digest: &str) -> Result<(), String> {
    let bad = || format!("digest {digest:?} is not algorithm:hex");
    let (algorithm, hex) = digest.split_once(':').ok_or_else(bad)?;
    let algorithm_ok = !algorithm.is_empty()
        && algorithm.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+._-".contains(c))
        && algorithm.starts_with(|c: char| c.is_ascii_alphanumeric());
    let hex_ok = hex.len() >= 32 && hex.chars().all(|c| c.is_ascii_hexdigit());
    let sha256_ok =
        algorithm != "sha256" || (hex.len() == 64 && !hex.contains(|c: char| c.is_ascii_uppercase()));
    if algorithm_ok && hex_ok && sha256_ok { Ok(()) } else { Err(bad()) }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// Exactly this repository.
    Repository(String),
    /// Every repository whose name starts with this (it ends with `/`).
    Below(String),
}

/// The repositories MailClusters may take their image from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageAllowlist {
    entries: Vec<Entry>,
    /// As given, for messages.
    given: Vec<String>,
}

impl Default for ImageAllowlist {
    fn default() -> Self {
        ImageAllowlist::parse([DEFAULT_ALLOWED_IMAGES]).expect("the default allowlist parses")
    }
}

impl fmt::Display for ImageAllowlist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.given.join(", "))
    }
}

impl ImageAllowlist {
    /// Entries are repositories (`registry/path`, no tag or digest), or paths
    /// ending in `/` for everything below them. Blank entries are skipped; an
    /// empty list is refused (it would stop every MailCluster).
    pub fn parse<S: AsRef<str>>(entries: impl IntoIterator<Item = S>) -> Result<Self, String> {
        let mut list = ImageAllowlist { entries: Vec::new(), given: Vec::new() };
        for raw in entries {
            let raw = raw.as_ref().trim();
            if raw.is_empty() {
                continue;
            }
            let entry = match raw.strip_suffix('/') {
                Some(prefix) if !prefix.contains('/') && is_registry(prefix) => {
                    check_registry(prefix).map_err(|e| format!("allowed image {raw:?}: {e}"))?;
                    Entry::Below(format!("{}/", prefix.to_ascii_lowercase()))
                }
                Some(prefix) => Entry::Below(format!(
                    "{}/",
                    normalize_name(prefix, false).map_err(|e| format!("allowed image {raw:?}: {e}"))?
                )),
                None => {
                    let parsed = parse_reference(raw).map_err(|e| format!("allowed image {raw:?}: {e}"))?;
                    if parsed.tag.is_some() || parsed.digest.is_some() {
                        return Err(format!(
                            "allowed image {raw:?}: name a repository, without a tag or digest"
                        ));
                    }
                    Entry::Repository(parsed.repository)
                }
            };
            list.entries.push(entry);
            list.given.push(raw.to_string());
        }
        if list.entries.is_empty() {
            return Err("the list of allowed images is empty".into());
        }
        Ok(list)
    }

    /// Comma-separated, as the flag and environment variable give it.
    pub fn parse_list(list: &str) -> Result<Self, String> {
        ImageAllowlist::parse(list.split(','))
    }

    /// Ok when `image` is a valid reference from an allowed repository; else why not.
    pub fn check(&self, image: &str) -> Result<(), String> {
        let parsed = parse_reference(image)
            .map_err(|e| format!("image {image:?} is not a valid image reference ({e})"))?;
        let allowed = self.entries.iter().any(|e| match e {
            Entry::Repository(r) => parsed.repository == *r,
            Entry::Below(prefix) => parsed.repository.starts_with(prefix.as_str()),
        });
        if allowed {
            Ok(())
        } else {
            Err(format!(
                "image {image:?} (repository {}) is not in the operator's allowed images: {self}",
                parsed.repository
            ))
        }
    }

    pub fn allows(&self, image: &str) -> bool {
        self.check(image).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn default() -> ImageAllowlist {
        ImageAllowlist::default()
    }

    #[test]
    fn the_default_allows_the_projects_repository_at_any_tag_or_digest() {
        let list = default();
        for image in [
            "ghcr.io/mailcluster/mailcluster:0.1.0".to_string(),
            "ghcr.io/mailcluster/mailcluster:latest".into(),
            "ghcr.io/mailcluster/mailcluster".into(),
            format!("ghcr.io/mailcluster/mailcluster@{DIGEST}"),
            format!("ghcr.io/mailcluster/mailcluster:0.1.0@{DIGEST}"),
            // Host names are case-insensitive.
            "GHCR.io/mailcluster/mailcluster:1".into(),
        ] {
            assert_eq!(list.check(&image), Ok(()), "{image}");
        }
    }

    #[test]
    fn prefixes_of_the_name_are_not_the_repository() {
        let list = default();
        for image in [
            "ghcr.io/mailcluster/mailcluster-evil:1",
            "ghcr.io/mailcluster/mailclusterx:1",
            "ghcr.io/mailcluster/mailcluster/evil:1",
            "ghcr.io/mailcluster/mailcluster.evil:1",
            "ghcr.io/mailcluster/mailcluster_evil:1",
            "ghcr.io/mailcluster:1",
            "ghcr.io.evil.example/mailcluster/mailcluster:1",
            "evil.example/ghcr.io/mailcluster/mailcluster:1",
            "mailcluster/mailcluster:1",
            "docker.io/mailcluster/mailcluster:1",
        ] {
            let err = list.check(image).expect_err(image);
            assert!(err.contains(image) && err.contains(DEFAULT_ALLOWED_IMAGES), "{err}");
        }
    }

    #[test]
    fn what_does_not_parse_is_refused() {
        let list = default();
        for image in [
            "",
            "ghcr.io/mailcluster/mailcluster:",
            "ghcr.io/mailcluster/mailcluster:1:2",
            "ghcr.io/mailcluster/mailcluster:-1",
            "ghcr.io/mailcluster/mailcluster@sha256:abc",
            "ghcr.io/mailcluster/mailcluster@sha256:abc:1",
            // What `repository: ghcr.io/…@sha256:…` with a `tag` composes to.
            &format!("ghcr.io/mailcluster/mailcluster@{DIGEST}:1"),
            "ghcr.io/mailcluster/mailcluster@@sha256:0",
            "ghcr.io/mailcluster/MailCluster:1",
            "ghcr.io/mailcluster//mailcluster:1",
            "ghcr.io/mailcluster/mailcluster/:1",
            "ghcr.io/mailcluster/mail cluster:1",
            "ghcr.io/mailcluster/mailcluster:1 ",
            "ghcr.io/mailcluster/-mailcluster:1",
            "ghcr.io/mailcluster/mailcluster..x:1",
            "ghcr.io:/mailcluster/mailcluster:1",
            "ghcr.io:99999/mailcluster/mailcluster:1",
            "ghcr.io:0/mailcluster/mailcluster:1",
            "ghcr..io/mailcluster/mailcluster:1",
            "ghcr.io/mailcluster/mailcluster#x:1",
        ] {
            assert!(list.check(image).is_err(), "{image:?} accepted");
        }
    }

    #[test]
    fn registry_ports_are_part_of_the_repository() {
        let list =
            ImageAllowlist::parse_list("registry.example.com:5000/mail/mailcluster, localhost/mc").unwrap();
        assert!(list.allows("registry.example.com:5000/mail/mailcluster:2.0"));
        assert!(list.allows(&format!("registry.example.com:5000/mail/mailcluster@{DIGEST}")));
        assert!(!list.allows("registry.example.com:5001/mail/mailcluster:2.0"), "another port");
        assert!(!list.allows("registry.example.com/mail/mailcluster:2.0"), "no port");
        assert!(list.allows("localhost/mc:1"));
        assert!(!list.allows("localhost:5000/mc:1"));
        // The default's registry with a port is another registry.
        assert!(!default().allows("ghcr.io:443/mailcluster/mailcluster:1"));
        // A tag that looks like a port is a tag.
        assert_eq!(parse_reference("localhost/mc:5000").unwrap().tag.as_deref(), Some("5000"));
        assert_eq!(
            parse_reference("localhost:5000/mc").unwrap(),
            ImageRef { repository: "localhost:5000/mc".into(), tag: None, digest: None }
        );
    }

    #[test]
    fn docker_hub_names_are_spelled_out_on_both_sides() {
        let list = ImageAllowlist::parse_list("alpine,docker.io/mailcluster/mailcluster").unwrap();
        for image in
            ["alpine:3", "library/alpine:3", "docker.io/library/alpine:3", "index.docker.io/library/alpine"]
        {
            assert!(list.allows(image), "{image}");
        }
        assert!(list.allows("mailcluster/mailcluster:1"));
        assert!(!list.allows("alpine-evil:3"));
        assert!(!list.allows("evil/alpine:3"));
    }

    #[test]
    fn a_path_ending_in_a_slash_allows_what_is_below_it_only() {
        let list = ImageAllowlist::parse_list("registry.example.com/mail/,mirror.example.com:8443/").unwrap();
        assert!(list.allows("registry.example.com/mail/mailcluster:1"));
        assert!(list.allows("registry.example.com/mail/team/mailcluster:1"));
        assert!(!list.allows("registry.example.com/mail-evil/mailcluster:1"));
        assert!(!list.allows("registry.example.com/mail:1"));
        assert!(list.allows("mirror.example.com:8443/anything/at/all:1"));
        assert!(!list.allows("mirror.example.com/anything:1"));
        assert!(!list.allows("mirror.example.com:84430/anything:1"));
    }

    #[test]
    fn entries_are_repositories() {
        for bad in [
            "",
            " , ",
            "ghcr.io/mailcluster/mailcluster:1.0",
            &format!("ghcr.io/mailcluster/mailcluster@{DIGEST}"),
            "ghcr.io/Mailcluster",
            "ghcr.io:x/",
            "*",
        ] {
            assert!(ImageAllowlist::parse_list(bad).is_err(), "{bad:?} accepted as an allowlist");
        }
        let list =
            ImageAllowlist::parse_list(" ghcr.io/mailcluster/mailcluster , ,registry.example.com/mail/ ")
                .unwrap();
        assert_eq!(list.to_string(), "ghcr.io/mailcluster/mailcluster, registry.example.com/mail/");
    }
}
