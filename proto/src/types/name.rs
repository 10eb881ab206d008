//! Resource names, the physical names only workers may report, and application namespaces.
//!
//! # Grammar
//!
//! ```text
//! name      = [ namespace "/" ] segment
//! namespace = segment
//! segment   = alnum *( alnum | "-" | "_" | "." )     ; 1 to 63 bytes
//! ```
//!
//! A whole name is at most [`ResourceName::MAX_LEN`] (128) bytes. Names are case-sensitive.
//!
//! # Physical and application resources
//!
//! Unqualified names `cpu`, `memory` and `gpu`, and every unqualified name that starts with
//! `gpu.` or `mig.` (per-device GPU identities and MIG profiles such as `mig.1g.10gb`), are
//! **physical**: workers report them and applications cannot set or delete them. Every other
//! name is an **application** resource. An application that names its [`Namespace`] gets its
//! unqualified names qualified as `namespace/name`, so two applications cannot collide; a
//! fully qualified name reaches across namespaces on purpose.

use std::borrow::Borrow;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::TypeError;

/// Whether a resource is reported by hardware or created by applications.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResourceKind {
    /// Reported by workers (`cpu`, `memory`, `gpu`, `gpu.*`, `mig.*`); applications cannot set it.
    Physical,
    /// Created, resized and deleted by applications at run time (an ephemeral resource).
    Application,
}

/// A validated resource name. Cheap to clone.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ResourceName(Arc<str>);

/// A validated application namespace (one name segment).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Namespace(Arc<str>);

const SEGMENT_MAX: usize = 63;

fn check_segment(whole: &str, seg: &str) -> Result<(), TypeError> {
    let bad = |why| TypeError::InvalidName {
        name: shorten(whole),
        why,
    };
    let Some(first) = seg.bytes().next() else {
        return Err(bad("empty name segment"));
    };
    if seg.len() > SEGMENT_MAX {
        return Err(bad("a name segment is at most 63 bytes"));
    }
    if !first.is_ascii_alphanumeric() {
        return Err(bad("must start with a letter or digit"));
    }
    if !seg
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(bad(
            "only letters, digits, '-', '_' and '.' are allowed (plus one '/')",
        ));
    }
    Ok(())
}

fn shorten(s: &str) -> String {
    if s.len() <= 80 {
        return s.to_string();
    }
    let mut end = 77;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// The physical names: reported by workers, never set by applications.
const PHYSICAL_EXACT: [&str; 3] = ["cpu", "memory", "gpu"];
const PHYSICAL_PREFIXES: [&str; 2] = ["gpu.", "mig."];

impl ResourceName {
    /// The longest valid name, in bytes.
    pub const MAX_LEN: usize = 128;

    /// Validates `name` against the grammar in the module documentation.
    pub fn new(name: &str) -> Result<ResourceName, TypeError> {
        if name.len() > Self::MAX_LEN {
            return Err(TypeError::InvalidName {
                name: shorten(name),
                why: "longer than 128 bytes",
            });
        }
        match name.split_once('/') {
            Some((ns, local)) => {
                check_segment(name, ns)?;
                check_segment(name, local)?;
                if is_physical(local) {
                    return Err(TypeError::InvalidName {
                        name: shorten(name),
                        why: "physical resource names cannot be namespaced",
                    });
                }
            }
            None => check_segment(name, name)?,
        }
        Ok(ResourceName(Arc::from(name)))
    }

    /// `cpu`: logical CPU cores.
    pub fn cpu() -> ResourceName {
        ResourceName(Arc::from("cpu"))
    }

    /// `memory`: MiB of memory.
    pub fn memory() -> ResourceName {
        ResourceName(Arc::from("memory"))
    }

    /// `gpu`: whole (or fractional) GPUs not in MIG mode.
    pub fn gpu() -> ResourceName {
        ResourceName(Arc::from("gpu"))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Physical (worker-reported) or application (ephemeral).
    pub fn kind(&self) -> ResourceKind {
        if is_physical(&self.0) {
            ResourceKind::Physical
        } else {
            ResourceKind::Application
        }
    }

    /// Whether only workers may report this resource.
    pub fn is_physical(&self) -> bool {
        self.kind() == ResourceKind::Physical
    }

    /// The namespace part, if the name is qualified.
    pub fn namespace(&self) -> Option<&str> {
        self.0.split_once('/').map(|(ns, _)| ns)
    }

    /// The name without its namespace.
    pub fn local_part(&self) -> &str {
        self.0.split_once('/').map_or(&self.0, |(_, local)| local)
    }

    /// Whether a caller of namespace `ns` may create, resize or delete this (qualified) name:
    /// the admin (no namespace) any, an application only its own namespace's. Names of the
    /// `shared` namespace and of other applications are for reading (requiring) only. The one
    /// rule behind every write path: resource calls, hooks, ghosts, reservations.
    pub fn writable_in(&self, ns: Option<&Namespace>) -> bool {
        match ns {
            None => true,
            Some(ns) => self.namespace().is_none_or(|q| q == ns.as_str()),
        }
    }

    /// This name as seen by an application in `ns`: physical and already qualified names are
    /// unchanged, and an unqualified application name becomes `ns/name`. Always valid: both
    /// parts are segments of at most 63 bytes, so the result is at most 127.
    pub fn in_namespace(&self, ns: &Namespace) -> ResourceName {
        if self.is_physical() || self.namespace().is_some() {
            return self.clone();
        }
        ResourceName(Arc::from(format!("{}/{}", ns.0, self.0)))
    }
}

fn is_physical(name: &str) -> bool {
    PHYSICAL_EXACT.contains(&name) || PHYSICAL_PREFIXES.iter().any(|p| name.starts_with(p))
}

impl FromStr for ResourceName {
    type Err = TypeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ResourceName::new(s)
    }
}

impl TryFrom<String> for ResourceName {
    type Error = TypeError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        ResourceName::new(&s)
    }
}

impl TryFrom<&str> for ResourceName {
    type Error = TypeError;
    fn try_from(s: &str) -> Result<Self, Self::Error> {
        ResourceName::new(s)
    }
}

impl From<ResourceName> for String {
    fn from(n: ResourceName) -> String {
        n.0.to_string()
    }
}

impl Borrow<str> for ResourceName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl Namespace {
    /// Validates a namespace: one name segment, not a physical name.
    pub fn new(ns: &str) -> Result<Namespace, TypeError> {
        check_segment(ns, ns)?;
        Ok(Namespace(Arc::from(ns)))
    }

    /// The namespace as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for Namespace {
    type Err = TypeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Namespace::new(s)
    }
}

impl TryFrom<String> for Namespace {
    type Error = TypeError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Namespace::new(&s)
    }
}

impl From<Namespace> for String {
    fn from(n: Namespace) -> String {
        n.0.to_string()
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_names() {
        for name in [
            "cpu",
            "my-res",
            "data_42",
            "team.a/queue-1",
            "A1",
            "gpu.0",
            "mig.1g.10gb",
        ] {
            let n = ResourceName::new(name).unwrap();
            assert_eq!(n.as_str(), name);
        }
    }

    #[test]
    fn invalid_names_say_why() {
        for (name, why) in [
            ("", "empty"),
            ("-x", "start"),
            ("a b", "only letters"),
            ("a/b/c", "only letters"),
            ("/x", "empty"),
            ("x/", "empty"),
            ("héllo", "only letters"),
            ("ns/cpu", "namespaced"),
            ("ns/mig.1g.5gb", "namespaced"),
        ] {
            let err = ResourceName::new(name).unwrap_err().to_string();
            assert!(err.contains(why), "{name:?}: {err}");
        }
        let long = "a".repeat(129);
        assert!(
            ResourceName::new(&long)
                .unwrap_err()
                .to_string()
                .contains("128")
        );
        let seg = "a".repeat(64);
        assert!(
            ResourceName::new(&seg)
                .unwrap_err()
                .to_string()
                .contains("63")
        );
    }

    #[test]
    fn reserved_physical_names() {
        for name in ["cpu", "memory", "gpu", "gpu.GPU-1234", "mig.1g.10gb"] {
            assert!(ResourceName::new(name).unwrap().is_physical(), "{name}");
        }
        for name in ["cpus", "gpux", "mig", "team/gpu-pool", "my-res"] {
            assert_eq!(
                ResourceName::new(name).unwrap().kind(),
                ResourceKind::Application
            );
        }
    }

    #[test]
    fn namespaces_keep_applications_apart() {
        let a = Namespace::new("app-a").unwrap();
        let b = Namespace::new("app-b").unwrap();
        let queue = ResourceName::new("queue").unwrap();
        let qa = queue.in_namespace(&a);
        let qb = queue.in_namespace(&b);
        assert_ne!(qa, qb);
        assert_eq!(qa.as_str(), "app-a/queue");
        assert_eq!(qa.namespace(), Some("app-a"));
        assert_eq!(qa.local_part(), "queue");
        assert_eq!(
            qa.in_namespace(&b),
            qa,
            "qualified names are not re-qualified"
        );
        assert_eq!(ResourceName::cpu().in_namespace(&a), ResourceName::cpu());
        assert!(Namespace::new("a/b").is_err());
    }
}
