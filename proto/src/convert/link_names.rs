//! Resource names sent once per worker stream.
//!
//! Every assignment names the resources its task holds, and a busy link carries the same few
//! names (`cpu`, `memory`, an application's slots) thousands of times a second. On a stream
//! whose worker said `interned_names` in its `Hello`, the head's [`LinkEncoder`] sends a name
//! in full the first time (in `Assign.new_names`, which gives it the next number) and only its
//! number after; the worker's [`LinkDecoder`] keeps the same table and turns the numbers back
//! into names, each validated once per stream instead of once per task.
//!
//! Both tables start empty with the stream and end with it, so a reconnection starts over,
//! and both stop growing at [`MAX_NAMES`]: a name that finds the table full travels in full, as
//! every name does to a worker that did not ask (a name used by one task only gains nothing
//! from a number, and a stream must not hold every name a long life of tasks ever used).

use rustc_hash::FxHashMap;

use super::{At, ConvertError, MAX_RESOURCES, Problem, check_count};
use crate::types::{Amount, HeadMessage, ResourceName, ResourceSet, TypeError};
use crate::wire;
use crate::wire::head_message::Body;

/// The most names one stream's table holds.
pub const MAX_NAMES: usize = 4096;

/// Turns the head's messages to one worker into wire messages, numbering resource names on a
/// stream whose worker asked for it. One per stream, used in the stream's order.
#[derive(Debug, Default)]
pub struct LinkEncoder {
    /// The numbers given so far; `None` when the worker reads names only in full.
    numbers: Option<FxHashMap<ResourceName, u32>>,
}

impl LinkEncoder {
    /// An encoder for a new stream; `interned` is what the worker's `Hello` asked for.
    pub fn new(interned: bool) -> LinkEncoder {
        LinkEncoder {
            numbers: interned.then(FxHashMap::default),
        }
    }

    /// How many names this stream's table holds.
    pub fn len(&self) -> usize {
        self.numbers.as_ref().map_or(0, |n| n.len())
    }

    /// Whether the table is empty (always, on a stream without numbers).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `msg` as sent on this stream: an assignment's resources by number where it can.
    pub fn encode(&mut self, msg: HeadMessage) -> wire::HeadMessage {
        let Some(numbers) = &mut self.numbers else {
            return msg.into();
        };
        let mut a = match msg {
            HeadMessage::Assign(a) => a,
            other => return other.into(),
        };
        let resources = std::mem::take(&mut a.spec.resources);
        let allocation = std::mem::take(&mut a.allocation);
        let mut new_names = Vec::new();
        let (plain, interned) = number(numbers, &resources, &mut new_names);
        // The allocation travels only where it differs from the request (see `From`).
        let (plain_allocation, interned_allocation) = if allocation == resources {
            (Vec::new(), Vec::new())
        } else {
            number(numbers, &allocation, &mut new_names)
        };
        let mut spec = wire::TaskSpec::from(a.spec);
        spec.resources = plain;
        wire::HeadMessage {
            body: Some(Body::Assign(wire::Assign {
                task_id: a.task_id.0,
                attempt: a.attempt,
                spec: Some(spec),
                allocation: plain_allocation,
                task_token: a.task_token,
                new_names,
                resources: interned,
                interned_allocation,
                objects: a.objects.into_iter().map(Into::into).collect(),
            })),
        }
    }
}

/// `set` split into the names that travel in full (the table is full) and those that travel
/// by number, numbering the names first seen now into `new_names`.
fn number(
    numbers: &mut FxHashMap<ResourceName, u32>,
    set: &ResourceSet,
    new_names: &mut Vec<String>,
) -> (Vec<wire::ResourceAmount>, Vec<wire::InternedAmount>) {
    let mut plain = Vec::new();
    let mut interned = Vec::with_capacity(set.len());
    for (name, amount) in set.iter() {
        let known = numbers.get(name).copied();
        let number = match known {
            Some(n) => n,
            None if numbers.len() < MAX_NAMES => {
                let n = numbers.len() as u32;
                numbers.insert(name.clone(), n);
                new_names.push(name.as_str().to_owned());
                n
            }
            None => {
                plain.push(wire::ResourceAmount {
                    name: name.as_str().to_owned(),
                    amount: amount.raw(),
                });
                continue;
            }
        };
        interned.push(wire::InternedAmount {
            name: number,
            amount: amount.raw(),
        });
    }
    (plain, interned)
}

/// Turns the head's wire messages on one stream back into domain values, keeping the stream's
/// name table. One per stream, fed the messages in the order they came.
#[derive(Debug, Default)]
pub struct LinkDecoder {
    /// The names by number; `None` for a name that was not valid (any use of it fails).
    names: Vec<Option<ResourceName>>,
}

impl LinkDecoder {
    /// A decoder for a new stream.
    pub fn new() -> LinkDecoder {
        LinkDecoder::default()
    }

    /// How many names this stream's table holds.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The domain value of `msg`. The names it adds join the table even when the rest of it is
    /// invalid, so that one bad message does not shift the numbers of every later one.
    pub fn decode(&mut self, mut msg: wire::HeadMessage) -> Result<HeadMessage, ConvertError> {
        let Some(Body::Assign(a)) = &mut msg.body else {
            return HeadMessage::try_from(msg);
        };
        let added = self.learn(std::mem::take(&mut a.new_names));
        let interned = std::mem::take(&mut a.resources);
        let interned_allocation = std::mem::take(&mut a.interned_allocation);
        let plain_allocation = !a.allocation.is_empty();
        added.at("assign")?;
        let HeadMessage::Assign(mut assignment) = HeadMessage::try_from(msg)? else {
            unreachable!("an Assign body converts to an assignment");
        };
        if !interned.is_empty() {
            let resources = std::mem::take(&mut assignment.spec.resources);
            assignment.spec.resources = self
                .merge(resources, &interned)
                .at("resources")
                .at("assign")?;
        }
        if plain_allocation || !interned_allocation.is_empty() {
            let allocation = if plain_allocation {
                std::mem::take(&mut assignment.allocation)
            } else {
                ResourceSet::new()
            };
            assignment.allocation = self
                .merge(allocation, &interned_allocation)
                .at("interned_allocation")
                .at("assign")?;
        } else {
            assignment.allocation = assignment.spec.resources.clone();
        }
        Ok(HeadMessage::Assign(assignment))
    }

    /// Adds `names` to the table, each numbered whether or not it is valid.
    fn learn(&mut self, names: Vec<String>) -> Result<(), ConvertError> {
        if self.names.len() + names.len() > MAX_NAMES {
            return Err(ConvertError::new(
                "new_names",
                Problem::TooMany {
                    len: self.names.len() + names.len(),
                    max: MAX_NAMES,
                },
            ));
        }
        let mut first_error = None;
        for (i, name) in names.into_iter().enumerate() {
            let parsed = ResourceName::new(&name);
            if let Err(e) = &parsed {
                first_error.get_or_insert_with(|| {
                    ConvertError::new(format!("new_names[{i}]"), Problem::Invalid(e.clone()))
                });
            }
            self.names.push(parsed.ok());
        }
        first_error.map_or(Ok(()), Err)
    }

    /// `set` with the numbered amounts of `interned` added; a name may appear once in all.
    fn merge(
        &self,
        set: ResourceSet,
        interned: &[wire::InternedAmount],
    ) -> Result<ResourceSet, ConvertError> {
        check_count("", set.len() + interned.len(), MAX_RESOURCES)?;
        let mut pairs: Vec<(ResourceName, Amount)> = set
            .iter()
            .map(|(name, amount)| (name.clone(), amount))
            .collect();
        for (i, entry) in interned.iter().enumerate() {
            let at = |e: TypeError| ConvertError::new(format!("[{i}]"), Problem::Invalid(e));
            let name = match self.names.get(entry.name as usize) {
                Some(Some(name)) => name.clone(),
                Some(None) => {
                    return Err(ConvertError::new(
                        format!("[{i}].name"),
                        Problem::Rule("names a resource name that was not valid"),
                    ));
                }
                None => {
                    return Err(ConvertError::new(
                        format!("[{i}].name"),
                        Problem::Rule("names a number that this stream never gave a name"),
                    ));
                }
            };
            pairs.push((name, Amount::from_raw(entry.amount).map_err(at)?));
        }
        // A zero amount still counts as a use of the name, as in a plain set.
        let mut names: Vec<&str> = pairs.iter().map(|(n, _)| n.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            let why = TypeError::Duplicate(w[0].to_string());
            return Err(ConvertError::new("", Problem::Invalid(why)));
        }
        ResourceSet::from_pairs(pairs).map_err(ConvertError::from)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use prost::Message;

    use super::*;
    use crate::convert::testutil::{arb_set, arb_spec, located, sample_specs, set};
    use crate::types::{Assignment, TaskId};

    fn assign(task: u64, resources: &str, allocation: &str) -> HeadMessage {
        let mut spec = sample_specs().remove(0);
        spec.resources = set(resources);
        HeadMessage::Assign(Assignment {
            task_id: TaskId(task),
            attempt: 1,
            spec,
            allocation: set(allocation),
            task_token: format!("token-{task}"),
            objects: vec![located(task)],
        })
    }

    /// Through protobuf bytes, as on a stream.
    fn sent(encoder: &mut LinkEncoder, msg: HeadMessage) -> wire::HeadMessage {
        let wire = encoder.encode(msg);
        wire::HeadMessage::decode(wire.encode_to_vec().as_slice()).unwrap()
    }

    fn body(msg: &wire::HeadMessage) -> &wire::Assign {
        match &msg.body {
            Some(Body::Assign(a)) => a,
            other => panic!("not an assignment: {other:?}"),
        }
    }

    #[test]
    fn a_name_travels_once_per_stream_and_every_message_comes_back() {
        let (mut encoder, mut decoder) = (LinkEncoder::new(true), LinkDecoder::new());
        let first = assign(1, "cpu=1,memory=512", "cpu=1,memory=512");
        let wire = sent(&mut encoder, first.clone());
        assert_eq!(body(&wire).new_names, ["cpu", "memory"]);
        assert!(body(&wire).spec.as_ref().unwrap().resources.is_empty());
        assert!(body(&wire).allocation.is_empty() && body(&wire).interned_allocation.is_empty());
        assert_eq!(decoder.decode(wire).unwrap(), first);

        // The same names again: numbers only, and fewer bytes than the names in full.
        let second = assign(2, "cpu=2,memory=512", "cpu=2,memory=512");
        let wire = sent(&mut encoder, second.clone());
        assert!(body(&wire).new_names.is_empty());
        let full = wire::HeadMessage::from(second.clone());
        assert!(wire.encoded_len() < full.encoded_len());
        assert_eq!(decoder.decode(wire).unwrap(), second);

        // An allocation that names devices: the new device name is numbered too.
        let third = assign(3, "cpu=1,mig.1g.5gb=1", "cpu=1,mig.1g.5gb=1,mig.MIG-0000=1");
        let wire = sent(&mut encoder, third.clone());
        assert_eq!(body(&wire).new_names, ["mig.1g.5gb", "mig.MIG-0000"]);
        assert_eq!(body(&wire).interned_allocation.len(), 3);
        assert_eq!(decoder.decode(wire).unwrap(), third);
        assert_eq!((encoder.len(), decoder.len()), (4, 4));

        // Every other message, and one without resources, is what it always was.
        let others = [
            HeadMessage::CancelTask {
                task_id: TaskId(1),
                attempt: 1,
                reason: "user".into(),
                force: false,
            },
            HeadMessage::Shutdown {
                reason: "bye".into(),
            },
            assign(4, "", ""),
        ];
        for msg in others {
            let wire = sent(&mut encoder, msg.clone());
            assert_eq!(wire, wire::HeadMessage::from(msg.clone()));
            assert_eq!(decoder.decode(wire).unwrap(), msg);
        }
    }

    #[test]
    fn a_worker_that_did_not_ask_gets_names_in_full() {
        let mut encoder = LinkEncoder::new(false);
        let msg = assign(1, "cpu=1", "cpu=1");
        for _ in 0..2 {
            let wire = encoder.encode(msg.clone());
            assert_eq!(wire, wire::HeadMessage::from(msg.clone()));
        }
        assert!(encoder.is_empty());
    }

    #[test]
    fn a_full_table_sends_the_rest_in_full() {
        let (mut encoder, mut decoder) = (LinkEncoder::new(true), LinkDecoder::new());
        for i in 0..MAX_NAMES / 2 {
            let msg = assign(
                i as u64,
                &format!("a{i}=1,b{i}=1"),
                &format!("a{i}=1,b{i}=1"),
            );
            decoder.decode(sent(&mut encoder, msg)).unwrap();
        }
        assert_eq!(encoder.len(), MAX_NAMES);
        let msg = assign(9, "a0=1,fresh=1", "a0=1,fresh=1");
        let wire = sent(&mut encoder, msg.clone());
        let a = body(&wire);
        assert!(a.new_names.is_empty());
        assert_eq!(a.resources.len(), 1, "a0 by number");
        assert_eq!(a.spec.as_ref().unwrap().resources[0].name, "fresh");
        assert_eq!(decoder.decode(wire).unwrap(), msg);
        assert_eq!((encoder.len(), decoder.len()), (MAX_NAMES, MAX_NAMES));
    }

    fn numbered(names: &[&str], resources: Vec<wire::InternedAmount>) -> wire::HeadMessage {
        let mut msg = wire::HeadMessage::from(assign(1, "", ""));
        let Some(Body::Assign(a)) = &mut msg.body else {
            unreachable!()
        };
        a.new_names = names.iter().map(|n| n.to_string()).collect();
        a.resources = resources;
        msg
    }

    fn amount(name: u32, amount: u64) -> wire::InternedAmount {
        wire::InternedAmount { name, amount }
    }

    #[test]
    fn bad_numbers_fail_their_message_and_keep_the_numbering() {
        let mut decoder = LinkDecoder::new();
        let err = decoder
            .decode(numbered(&["cpu"], vec![amount(1, 10_000)]))
            .unwrap_err();
        assert_eq!(err.path(), "assign.resources[0].name");
        assert!(err.to_string().contains("never gave a name"), "{err}");
        // An invalid name fails its message, yet takes its number: the next one is still 2.
        let err = decoder
            .decode(numbered(&["b@d", "gpu"], vec![amount(0, 10_000)]))
            .unwrap_err();
        assert_eq!(err.path(), "assign.new_names[0]");
        let ok = decoder
            .decode(numbered(&[], vec![amount(0, 10_000), amount(2, 5_000)]))
            .unwrap();
        let HeadMessage::Assign(a) = ok else {
            unreachable!()
        };
        assert_eq!(a.spec.resources, set("cpu=1,gpu=0.5"));
        assert_eq!(a.allocation, a.spec.resources);
        let err = decoder
            .decode(numbered(&[], vec![amount(1, 10_000)]))
            .unwrap_err();
        assert!(err.to_string().contains("was not valid"), "{err}");

        // A name in both forms, or twice by number, is refused.
        let mut twice = numbered(&[], vec![amount(0, 10_000)]);
        if let Some(Body::Assign(a)) = &mut twice.body {
            a.spec.as_mut().unwrap().resources = vec![wire::ResourceAmount {
                name: "cpu".into(),
                amount: 10_000,
            }];
        }
        let err = decoder.decode(twice).unwrap_err();
        assert!(err.to_string().contains("cpu"), "{err}");
        let err = decoder
            .decode(numbered(&[], vec![amount(0, 1), amount(0, 2)]))
            .unwrap_err();
        assert_eq!(err.path(), "assign.resources");
        // And a table that would grow past its limit.
        let many: Vec<String> = (0..MAX_NAMES).map(|i| format!("n{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let err = decoder.decode(numbered(&many, vec![])).unwrap_err();
        assert_eq!(err.path(), "assign.new_names");
    }

    proptest! {
        #[test]
        fn any_stream_of_assignments_comes_back(
            specs in prop::collection::vec((arb_spec(), arb_set()), 1..12),
        ) {
            let (mut encoder, mut decoder) = (LinkEncoder::new(true), LinkDecoder::new());
            for (i, (spec, extra)) in specs.into_iter().enumerate() {
                // Half of them hold devices beyond what they asked for.
                let mut allocation = spec.resources.clone();
                if i % 2 == 1 {
                    let _ = allocation.merge(&extra);
                }
                let msg = HeadMessage::Assign(Assignment {
                    task_id: TaskId(i as u64),
                    attempt: 1,
                    spec,
                    allocation,
                    task_token: String::new(),
                    objects: (0..i as u64 % 3).map(located).collect(),
                });
                prop_assert_eq!(decoder.decode(sent(&mut encoder, msg.clone())).unwrap(), msg);
            }
            prop_assert_eq!(encoder.len(), decoder.len());
        }
    }
}
