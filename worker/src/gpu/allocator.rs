//! [`DeviceAllocator`]: which task holds which device (a whole GPU or a MIG slice), and how
//! much of it.
//!
//! The head admits tasks by counts (`gpu: 2`, `mig.1g.5gb: 1`); the worker gives each admitted
//! task concrete devices for what it holds:
//!
//! - a class amount `n` (`gpu`, `mig.<profile>`) takes `floor(n)` devices of the class that
//!   are wholly free, plus, for a fractional remainder, a share of one more device: the one
//!   with the least room that still fits (so fractions pack onto one device until it is
//!   full), ties to the lowest GPU index and start;
//! - an identity (`gpu.<uuid>`, `mig.<uuid>`) pins that device, for the amount asked, and
//!   counts toward the class amount of the same task;
//! - nothing is bound unless everything is (all or nothing), and no device is ever given more
//!   than its capacity of one.
//!
//! Because the head counts per class, a task can be admitted while no single device has room
//! for it (fractions spread over two GPUs, or a pinned device that an unpinned task took). Such
//! a bind answers [`BindError::Wait`]: the worker keeps the task until a release makes room.
//! A bind that can never succeed on this node (more devices than the class has, a device that
//! is gone or being rebuilt) answers [`BindError::Never`].
//!
//! Devices being reconfigured are *retiring*: nothing new is bound to them, and the
//! reconfiguration starts once their holders are gone.

use std::collections::{BTreeMap, BTreeSet};

use escher_proto::types::{DeviceHold, GpuInfo, is_gpu_resource};
use escher_proto::{Amount, ResourceName, ResourceSet};

/// What holds devices: one runner of one task attempt (the worker's runner sequence number,
/// unique for the worker's life, so a late release can never free a later runner's devices).
pub(crate) type Holder = u64;

/// Why devices could not be bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BindError {
    /// Not now: a release may make room.
    Wait(String),
    /// Never on this node; the text says why.
    Never(String),
}

/// One device.
#[derive(Debug, Clone)]
struct Device {
    /// `gpu` or `mig.<profile>`.
    class: ResourceName,
    /// (GPU index, start): the order devices are handed out in.
    order: (u32, u8),
    /// How much of it is bound.
    used: Amount,
    /// Being reconfigured: nothing new is bound to it.
    retiring: bool,
}

impl Device {
    fn free(&self) -> Amount {
        Amount::ONE.saturating_sub(self.used)
    }
}

/// The devices of one worker and who holds them. See the module documentation.
#[derive(Debug, Clone, Default)]
pub(crate) struct DeviceAllocator {
    /// By UUID.
    devices: BTreeMap<String, Device>,
    /// Identity resource name to UUID.
    identities: BTreeMap<ResourceName, String>,
    /// What each holder holds, by UUID.
    holds: BTreeMap<Holder, Vec<DeviceHold>>,
}

impl DeviceAllocator {
    /// An allocator for these GPUs' devices: whole GPUs not in MIG mode, and MIG slices.
    pub(crate) fn new(gpus: &[GpuInfo]) -> DeviceAllocator {
        let mut alloc = DeviceAllocator::default();
        for gpu in gpus {
            alloc.add_gpu(gpu);
        }
        alloc
    }

    /// Adds a GPU's devices: the GPU itself when not in MIG mode, else its slices. A device
    /// whose UUID cannot be named as a resource is left out (discovery warned about it).
    fn add_gpu(&mut self, gpu: &GpuInfo) {
        // (UUID, class, identity, order) of each device.
        type Entry<'a> = (
            &'a str,
            Option<ResourceName>,
            Option<ResourceName>,
            (u32, u8),
        );
        let entries: Vec<Entry<'_>> = if gpu.mig_enabled {
            gpu.slices
                .iter()
                .map(|s| {
                    (
                        s.uuid.as_str(),
                        s.class(),
                        s.identity(),
                        (gpu.index, s.start),
                    )
                })
                .collect()
        } else {
            let identity = escher_proto::types::gpu_identity(&gpu.uuid);
            vec![(
                gpu.uuid.as_str(),
                Some(ResourceName::gpu()),
                identity,
                (gpu.index, 0),
            )]
        };
        for (uuid, class, identity, order) in entries {
            let (Some(class), Some(identity)) = (class, identity) else {
                continue;
            };
            self.identities.insert(identity, uuid.to_string());
            let device = Device {
                class,
                order,
                used: Amount::ZERO,
                retiring: false,
            };
            self.devices.insert(uuid.to_string(), device);
        }
    }

    /// Replaces the devices of GPU `index` by those of `gpu` (after a reconfiguration). Holds
    /// of devices that are gone are dropped; the caller has waited for them to be released.
    pub(crate) fn replace_gpu(&mut self, index: u32, gpu: &GpuInfo) {
        let gone: Vec<String> = self
            .devices
            .iter()
            .filter(|(_, d)| d.order.0 == index)
            .map(|(u, _)| u.clone())
            .collect();
        for uuid in &gone {
            self.devices.remove(uuid);
        }
        self.identities.retain(|_, u| !gone.contains(u));
        self.add_gpu(gpu);
    }

    /// Marks devices as retiring (or not): nothing new is bound to a retiring device.
    pub(crate) fn set_retiring(&mut self, uuids: &BTreeSet<String>, retiring: bool) {
        for uuid in uuids {
            if let Some(d) = self.devices.get_mut(uuid) {
                d.retiring = retiring;
            }
        }
    }

    /// Whether no task holds any of these devices.
    pub(crate) fn all_free(&self, uuids: &BTreeSet<String>) -> bool {
        uuids
            .iter()
            .all(|u| self.devices.get(u).is_none_or(|d| d.used.is_zero()))
    }

    /// Whether this worker has any device.
    pub(crate) fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// How much of a device is bound (zero for an unknown device).
    pub(crate) fn used(&self, uuid: &str) -> Amount {
        self.devices.get(uuid).map_or(Amount::ZERO, |d| d.used)
    }

    /// Gives `holder` devices for the GPU resources of `allocation` (nothing for an allocation
    /// without any), all or nothing. Binding a holder twice returns what it already holds.
    pub(crate) fn bind(
        &mut self,
        holder: Holder,
        allocation: &ResourceSet,
    ) -> Result<Vec<DeviceHold>, BindError> {
        if let Some(held) = self.holds.get(&holder) {
            return Ok(held.clone());
        }
        // Pinned devices first: each identity names one device.
        let mut plan: BTreeMap<String, Amount> = BTreeMap::new();
        let mut pinned: BTreeMap<ResourceName, Amount> = BTreeMap::new();
        for (name, amount) in allocation.iter() {
            if !is_gpu_resource(name.as_str()) || amount.is_zero() || is_class(name) {
                continue;
            }
            let Some(uuid) = self.identities.get(name) else {
                return Err(BindError::Never(format!(
                    "no device here is named {name}: it is gone or on another node"
                )));
            };
            let device = &self.devices[uuid];
            if device.retiring {
                return Err(BindError::Never(format!(
                    "device {uuid} ({name}) is being reconfigured"
                )));
            }
            if amount > Amount::ONE {
                return Err(BindError::Never(format!(
                    "{name}: {amount} is more than the whole device"
                )));
            }
            if device.free() < amount {
                return Err(BindError::Wait(format!(
                    "device {uuid} has {} free, {amount} wanted",
                    device.free()
                )));
            }
            plan.insert(uuid.clone(), amount);
            let e = pinned.entry(device.class.clone()).or_insert(Amount::ZERO);
            *e = e.checked_add(amount).unwrap_or(Amount::MAX);
        }
        // Then each class, less what its pins already give.
        for (class, amount) in allocation.iter().filter(|(n, _)| is_class(n)) {
            let rest = amount.saturating_sub(pinned.get(class).copied().unwrap_or(Amount::ZERO));
            self.plan_class(class, rest, &mut plan)?;
        }
        let holds: Vec<DeviceHold> = plan
            .into_iter()
            .map(|(uuid, amount)| DeviceHold { uuid, amount })
            .collect();
        for h in &holds {
            let d = self.devices.get_mut(&h.uuid).expect("planned from the map");
            d.used = d.used.checked_add(h.amount).unwrap_or(Amount::MAX);
        }
        let mut holds = holds;
        holds.sort_by_key(|h| self.devices[&h.uuid].order);
        if !holds.is_empty() {
            self.holds.insert(holder, holds.clone());
        }
        Ok(holds)
    }

    /// Adds to `plan` devices of `class` for `amount`: whole free devices for its integer part,
    /// a best-fitting share of one more for the rest.
    fn plan_class(
        &self,
        class: &ResourceName,
        amount: Amount,
        plan: &mut BTreeMap<String, Amount>,
    ) -> Result<(), BindError> {
        if amount.is_zero() {
            return Ok(());
        }
        let whole = amount.raw() / Amount::ONE.raw();
        let frac = Amount::from_raw(amount.raw() % Amount::ONE.raw()).unwrap_or(Amount::ZERO);
        let needed = whole + u64::from(!frac.is_zero());
        let mut candidates: Vec<(&String, &Device)> = self
            .devices
            .iter()
            .filter(|(u, d)| &d.class == class && !d.retiring && !plan.contains_key(*u))
            .collect();
        if (candidates.len() as u64) < needed {
            return Err(BindError::Never(format!(
                "{class}: {amount} needs {needed} device(s) and this node has {} usable",
                candidates.len()
            )));
        }
        candidates.sort_by_key(|(_, d)| d.order);
        let mut taken = 0;
        for (uuid, d) in &candidates {
            if taken == whole {
                break;
            }
            if d.used.is_zero() {
                plan.insert((*uuid).clone(), Amount::ONE);
                taken += 1;
            }
        }
        if taken < whole {
            return Err(BindError::Wait(format!(
                "{class}: {whole} wholly free device(s) wanted, {taken} free now"
            )));
        }
        if !frac.is_zero() {
            let best = candidates
                .iter()
                .filter(|(u, d)| !plan.contains_key(*u) && d.free() >= frac)
                .min_by_key(|(_, d)| (d.free(), d.order));
            match best {
                Some((uuid, _)) => {
                    plan.insert((*uuid).clone(), frac);
                }
                None => {
                    return Err(BindError::Wait(format!(
                        "{class}: no single device has {frac} free now"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Releases what `holder` holds; `true` if it held something.
    pub(crate) fn release(&mut self, holder: Holder) -> bool {
        let Some(holds) = self.holds.remove(&holder) else {
            return false;
        };
        for h in holds {
            if let Some(d) = self.devices.get_mut(&h.uuid) {
                d.used = d.used.saturating_sub(h.amount);
            }
        }
        true
    }

    /// Checks the invariant: every device's use is the sum of its holds and at most one.
    #[cfg(test)]
    pub(crate) fn sanity_check(&self) -> Result<(), String> {
        let mut sums: BTreeMap<&str, Amount> = BTreeMap::new();
        for holds in self.holds.values() {
            for h in holds {
                let e = sums.entry(h.uuid.as_str()).or_insert(Amount::ZERO);
                *e = e.checked_add(h.amount).map_err(|e| e.to_string())?;
            }
        }
        for (uuid, d) in &self.devices {
            let sum = sums.get(uuid.as_str()).copied().unwrap_or(Amount::ZERO);
            if sum != d.used {
                return Err(format!("{uuid}: used {} but holds sum to {sum}", d.used));
            }
            if d.used > Amount::ONE {
                return Err(format!("{uuid}: used {} beyond its capacity of 1", d.used));
            }
        }
        Ok(())
    }
}

/// Whether a GPU resource name is a class (`gpu`, `mig.<profile>`) rather than an identity:
/// MIG profile names start with their GPC count, a digit.
fn is_class(name: &ResourceName) -> bool {
    let n = name.as_str();
    n == "gpu"
        || n.strip_prefix("mig.")
            .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
}
