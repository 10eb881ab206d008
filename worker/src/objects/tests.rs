//! The store's scenario tests: real files in a temporary directory on `/dev/shm` (the memory
//! root) and one on disk (the spill root), with [`ObjectStore::sanity_check`] (the table's
//! invariants, and the directories holding exactly its files) after every step.

use std::path::Path;

use super::*;

const MIB: u64 = 1 << 20;

/// A store over temporary roots, removed after it.
struct Fixture {
    store: ObjectStore,
    memory_root: tempfile::TempDir,
    spill_root: tempfile::TempDir,
}

fn fixture(capacity: u64) -> Fixture {
    let memory_root = tempfile::tempdir_in("/dev/shm").unwrap();
    let spill_root = tempfile::tempdir().unwrap();
    let store = ObjectStore::open(StoreConfig {
        capacity,
        memory_root: memory_root.path().to_path_buf(),
        spill_root: spill_root.path().to_path_buf(),
    })
    .unwrap();
    Fixture {
        store,
        memory_root,
        spill_root,
    }
}

impl Fixture {
    fn check(&self) {
        self.store.sanity_check().unwrap();
    }
}

fn data(size: u64, seed: u64) -> Vec<u8> {
    let mut bytes = vec![0; size as usize];
    fastrand::Rng::with_seed(seed).fill(&mut bytes);
    bytes
}

fn put(store: &ObjectStore, id: ObjectId, bytes: &[u8]) -> ObjectInfo {
    let mut writer = store.create(id, bytes.len() as u64).unwrap();
    writer.append(bytes).unwrap();
    writer.seal(crc32c::crc32c(bytes)).unwrap()
}

fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

fn spilled(store: &ObjectStore) -> Vec<ObjectId> {
    store
        .list()
        .iter()
        .filter(|s| s.spilled)
        .map(|s| s.info.id)
        .collect()
}

#[test]
fn objects_of_every_size_round_trip_with_their_checksums() {
    let f = fixture(256 * MIB);
    for (n, size) in [0, 1024, MIB, 100 * MIB].into_iter().enumerate() {
        let id = ObjectId(1, n as u64);
        let bytes = data(size, n as u64);
        let crc = crc32c::crc32c(&bytes);
        let mut writer = f.store.create(id, size).unwrap();
        assert!(!f.store.contains(id), "visible before its seal");
        // A put's way: in order, in pieces.
        for chunk in bytes.chunks(4 * MIB as usize) {
            writer.append(chunk).unwrap();
        }
        assert_eq!(
            writer.seal(crc).unwrap(),
            ObjectInfo {
                id,
                size,
                crc32c: crc
            }
        );
        let view = f.store.get(id).unwrap();
        assert_eq!((view.len(), view.crc32c()), (size, crc));
        assert_eq!(crc32c::crc32c(view.as_slice()), crc);
        assert!(view.as_slice() == bytes.as_slice());
        assert_eq!(view.bytes().len() as u64, size);
        // The path a same-node reader maps holds the same bytes, read-only.
        assert_eq!(std::fs::read(view.path()).unwrap(), bytes);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(view.path()).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o444);
        f.check();
    }
    let usage = f.store.usage();
    assert_eq!((usage.objects, usage.memory_bytes), (4, 101 * MIB + 1024));
}

#[test]
fn chunks_in_any_order_and_written_twice_seal_whole() {
    let f = fixture(16 * MIB);
    let id = ObjectId(2, 0);
    let bytes = data(MIB + 17, 7);
    let mut writer = f.store.create(id, bytes.len() as u64).unwrap();
    let chunk = 64 * 1024;
    let mut offsets: Vec<usize> = (0..bytes.len()).step_by(chunk).collect();
    fastrand::Rng::with_seed(3).shuffle(&mut offsets);
    for &at in &offsets {
        let end = (at + chunk).min(bytes.len());
        writer.write_at(at as u64, &bytes[at..end]).unwrap();
    }
    // A resumed fetch writes a range again.
    writer.write_at(1000, &bytes[1000..200_000]).unwrap();
    assert_eq!(writer.written(), bytes.len() as u64);
    writer.seal(crc32c::crc32c(&bytes)).unwrap();
    assert!(f.store.get(id).unwrap().as_slice() == bytes.as_slice());
    f.check();
}

#[test]
fn chunks_summed_by_the_caller_seal_by_their_sums() {
    let f = fixture(16 * MIB);
    let bytes = data(MIB + 17, 9);
    let chunk = 256 * 1024;
    let write = |id: ObjectId, lie: bool| {
        let mut writer = f.store.create(id, bytes.len() as u64).unwrap();
        for at in (0..bytes.len()).step_by(chunk) {
            let piece = &bytes[at..(at + chunk).min(bytes.len())];
            let sum = crc32c::crc32c(piece) ^ u32::from(lie && at == chunk);
            writer.write_summed(at as u64, piece, sum).unwrap();
        }
        writer.seal(crc32c::crc32c(&bytes))
    };
    // In order, the object's checksum is combined from the chunks' sums, not summed again.
    write(ObjectId(3, 0), false).unwrap();
    assert!(f.store.get(ObjectId(3, 0)).unwrap().as_slice() == bytes.as_slice());
    // So a wrong sum given for right bytes is what the seal checks, and it refuses the copy.
    let refused = write(ObjectId(3, 1), true).unwrap_err();
    assert!(
        matches!(refused, ObjectError::ChecksumMismatch { id, .. } if id == ObjectId(3, 1)),
        "{refused}"
    );
    assert!(matches!(
        f.store.get(ObjectId(3, 1)),
        Err(ObjectError::NotFound { .. })
    ));
    f.check();
}

#[test]
fn cold_objects_spill_least_recently_used_first_and_are_restored() {
    let f = fixture(3 * MIB);
    let ids: Vec<ObjectId> = (0..4).map(|i| ObjectId(3, i)).collect();
    let all: Vec<Vec<u8>> = (0..4).map(|i| data(MIB, 10 + i)).collect();
    for i in 0..3 {
        put(&f.store, ids[i], &all[i]);
    }
    drop(f.store.get(ids[0]).unwrap()); // 0 is now more recent than 1 and 2
    put(&f.store, ids[3], &all[3]);
    assert_eq!(spilled(&f.store), vec![ids[1]]);
    assert_eq!(files(f.store.spill_dir()).len(), 1);
    let usage = f.store.usage();
    assert_eq!(
        (
            usage.memory_bytes,
            usage.spilled_bytes,
            usage.spilled_objects
        ),
        (3 * MIB, MIB, 1)
    );
    f.check();

    // Reading 1 brings it back, and spills the coldest of the others (2).
    let view = f.store.get(ids[1]).unwrap();
    assert!(view.as_slice() == all[1].as_slice());
    assert!(view.path().starts_with(f.store.memory_dir()));
    assert_eq!(spilled(&f.store), vec![ids[2]]);
    f.check();
    drop(view);
    for i in 0..4 {
        assert!(
            f.store.get(ids[i]).unwrap().as_slice() == all[i].as_slice(),
            "object {i}"
        );
        f.check();
    }
}

#[test]
fn pinned_objects_are_never_spilled() {
    let f = fixture(2 * MIB);
    let (a, b, c) = (ObjectId(4, 0), ObjectId(4, 1), ObjectId(4, 2));
    let bytes_a = data(MIB, 1);
    put(&f.store, a, &bytes_a);
    put(&f.store, b, &data(MIB, 2));
    let view_a = f.store.get(a).unwrap();
    // a is pinned; b goes although a was sealed first.
    drop(f.store.get(b).unwrap());
    put(&f.store, c, &data(MIB, 3));
    assert_eq!(spilled(&f.store), vec![b]);
    let view_c = f.store.get(c).unwrap();
    f.check();

    // Everything in memory is pinned: a new object is refused and nothing changes.
    let before = f.store.usage();
    assert_eq!((before.pinned_objects, before.pinned_bytes), (2, 2 * MIB));
    let e = f.store.create(ObjectId(4, 3), 1).unwrap_err();
    assert!(
        matches!(e, ObjectError::TooLarge { pinned, .. } if pinned == 2 * MIB),
        "{e}"
    );
    assert!(e.to_string().contains("object 4.3 of 1 bytes"), "{e}");
    assert_eq!(f.store.usage(), before);
    f.check();

    // A spilled object read while nothing can be spilled is mapped where it lies.
    let view_b = f.store.get(b).unwrap();
    assert!(
        view_b.path().starts_with(f.store.spill_dir()),
        "{:?}",
        view_b.path()
    );
    assert!(view_b.as_slice() == data(MIB, 2).as_slice());
    assert_eq!(spilled(&f.store), vec![b]);
    assert!(view_a.as_slice() == bytes_a.as_slice());
    f.check();

    // Unpinned, a is the coldest of a and c.
    drop((view_a, view_b, view_c));
    put(&f.store, ObjectId(4, 3), &data(MIB, 4));
    assert_eq!(spilled(&f.store), vec![a, b]);
    f.check();
}

#[test]
fn deleting_returns_the_store_to_its_start() {
    let f = fixture(4 * MIB);
    let start = f.store.usage();
    assert_eq!(
        start,
        StoreUsage {
            capacity: 4 * MIB,
            ..StoreUsage::default()
        }
    );
    for i in 0..10 {
        put(&f.store, ObjectId(5, i), &data(MIB / 2 + i, i));
        drop(f.store.get(ObjectId(5, i / 2)).unwrap());
        f.check();
    }
    assert!(f.store.usage().spilled_objects > 0);
    for i in 0..10 {
        f.store.delete(ObjectId(5, i)).unwrap();
        f.check();
    }
    assert_eq!(f.store.usage(), start);
    assert!(files(f.store.memory_dir()).is_empty());
    assert!(files(f.store.spill_dir()).is_empty());
}

#[test]
fn deleting_a_pinned_object_waits_for_its_readers() {
    let f = fixture(4 * MIB);
    let id = ObjectId(6, 0);
    let bytes = data(MIB, 6);
    put(&f.store, id, &bytes);
    let view = f.store.get(id).unwrap();
    let held = view.bytes();
    let path = view.path().to_path_buf();
    drop(view);
    f.store.delete(id).unwrap();
    assert!(matches!(f.store.get(id), Err(ObjectError::NotFound { .. })));
    assert!(matches!(
        f.store.delete(id),
        Err(ObjectError::NotFound { .. })
    ));
    assert!(path.exists(), "unlinked under a reader");
    assert_eq!(f.store.usage().memory_bytes, MIB);
    assert_eq!(f.store.usage().objects, 0);
    f.check();

    // The same id stored again (a rebuilt object) is another file; the old one still reads.
    let again = data(1000, 60);
    put(&f.store, id, &again);
    assert!(f.store.get(id).unwrap().as_slice() == again.as_slice());
    assert!(held == bytes.as_slice());
    f.check();

    drop(held);
    assert!(!path.exists());
    assert_eq!(f.store.usage().memory_bytes, 1000);
    f.store.delete(id).unwrap();
    assert_eq!(
        f.store.usage(),
        StoreUsage {
            capacity: 4 * MIB,
            ..StoreUsage::default()
        }
    );
    f.check();
}

#[test]
fn bad_input_is_refused_naming_the_object_and_leaves_nothing() {
    let f = fixture(4 * MIB);
    let empty = |f: &Fixture| {
        f.check();
        assert!(files(f.store.memory_dir()).is_empty());
        assert!(files(f.store.spill_dir()).is_empty());
        assert_eq!(
            f.store.usage(),
            StoreUsage {
                capacity: 4 * MIB,
                ..StoreUsage::default()
            }
        );
    };
    let id = ObjectId(7, 1);

    let e = f.store.create(id, 4 * MIB + 1).unwrap_err();
    assert!(matches!(e, ObjectError::TooLarge { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("object 7.1 of 4194305 bytes does not fit"),
        "{e}"
    );
    empty(&f);

    // A checksum that does not match: in order, and computed by reading back.
    let bytes = data(MIB, 7);
    for in_order in [true, false] {
        let mut writer = f.store.create(id, MIB).unwrap();
        if in_order {
            writer.append(&bytes).unwrap();
        } else {
            writer.write_at(10, &bytes[10..]).unwrap();
            writer.write_at(0, &bytes[..10]).unwrap();
        }
        let e = writer.seal(crc32c::crc32c(&bytes) ^ 1).unwrap_err();
        assert!(matches!(e, ObjectError::ChecksumMismatch { .. }), "{e}");
        assert!(e.to_string().contains("object 7.1 is corrupt"), "{e}");
        assert!(!f.store.contains(id));
        empty(&f);
    }

    // A seal before the last byte, a write past the end, an abort, a drop.
    let mut writer = f.store.create(id, 100).unwrap();
    writer.write_at(0, &bytes[..99]).unwrap();
    let e = writer.write_at(99, &bytes[..2]).unwrap_err();
    assert!(
        e.to_string()
            .contains("object 7.1 is 100 bytes: a write of 2 bytes at offset 99"),
        "{e}"
    );
    assert!(matches!(
        writer.write_at(u64::MAX, &bytes[..2]),
        Err(ObjectError::OutOfBounds { .. })
    ));
    let e = writer.seal(0).unwrap_err();
    assert!(
        e.to_string()
            .contains("object 7.1 is incomplete: 99 of its 100 bytes"),
        "{e}"
    );
    empty(&f);
    let mut writer = f.store.create(id, 100).unwrap();
    writer.append(&bytes[..50]).unwrap();
    writer.abort();
    empty(&f);
    drop(f.store.create(id, 100).unwrap());
    empty(&f);

    // An id in use, being written or sealed; ids that are not here.
    let writer = f.store.create(id, 1).unwrap();
    assert!(matches!(
        f.store.create(id, 1),
        Err(ObjectError::Exists { .. })
    ));
    assert!(
        matches!(f.store.get(id), Err(ObjectError::NotFound { .. })),
        "readable unsealed"
    );
    assert!(matches!(
        f.store.delete(id),
        Err(ObjectError::NotFound { .. })
    ));
    writer.seal(crc32c::crc32c(b"")).unwrap_err();
    put(&f.store, id, b"x");
    let e = f.store.create(id, 1).unwrap_err();
    assert!(e.to_string().contains("object 7.1 exists already"), "{e}");
    f.store.delete(id).unwrap();
    let e = f.store.get(ObjectId(7, 2)).unwrap_err();
    assert!(
        e.to_string()
            .contains("object 7.2 is not in this node's object store"),
        "{e}"
    );
    empty(&f);
}

#[test]
fn a_full_memory_filesystem_refuses_the_object() {
    // A capacity larger than /dev/shm, as in a container with a small --shm-size.
    let memory_root = tempfile::tempdir_in("/dev/shm").unwrap();
    let spill_root = tempfile::tempdir().unwrap();
    let stat = nix::sys::statvfs::statvfs(memory_root.path()).unwrap();
    let free = stat.blocks_available() as u64 * stat.fragment_size() as u64;
    let store = ObjectStore::open(StoreConfig {
        capacity: u64::MAX / 2,
        memory_root: memory_root.path().to_path_buf(),
        spill_root: spill_root.path().to_path_buf(),
    })
    .unwrap();
    let e = store.create(ObjectId(8, 0), free + 1024 * MIB).unwrap_err();
    assert!(matches!(e, ObjectError::MemoryDirFull { .. }), "{e}");
    assert!(e.to_string().contains("object 8.0 of"), "{e}");
    store.sanity_check().unwrap();
    assert!(files(store.memory_dir()).is_empty());
    assert_eq!(store.usage().writing_bytes, 0);
}

#[test]
fn a_streamed_copy_is_refused_at_creation_when_the_memory_filesystem_has_no_room() {
    // A copy streamed in (a fetch, a push) is not allocated up front: its room is checked,
    // beside what the store's other streamed writers have still to write.
    let memory_root = tempfile::tempdir_in("/dev/shm").unwrap();
    let spill_root = tempfile::tempdir().unwrap();
    let stat = nix::sys::statvfs::statvfs(memory_root.path()).unwrap();
    let free = stat.blocks_available() as u64 * stat.fragment_size() as u64;
    let store = ObjectStore::open(StoreConfig {
        capacity: u64::MAX / 2,
        memory_root: memory_root.path().to_path_buf(),
        spill_root: spill_root.path().to_path_buf(),
    })
    .unwrap();
    let e = store
        .create_streamed(ObjectId(8, 0), free + 1024 * MIB)
        .unwrap_err();
    assert!(matches!(e, ObjectError::MemoryDirFull { .. }), "{e}");
    assert!(e.to_string().contains("object 8.0 of"), "{e}");
    // Two that fit one at a time but not together: the second is refused while the first
    // has its bytes still to write, and fits once the first is dropped.
    let first = store.create_streamed(ObjectId(8, 1), free / 3 * 2).unwrap();
    let e = store
        .create_streamed(ObjectId(8, 2), free / 3 * 2)
        .unwrap_err();
    assert!(matches!(e, ObjectError::MemoryDirFull { .. }), "{e}");
    assert!(e.to_string().contains("object 8.2 of"), "{e}");
    drop(first);
    let second = store.create_streamed(ObjectId(8, 2), free / 3 * 2).unwrap();
    drop(second);
    // Written and sealed, a streamed copy is an object like any other, and its promise is
    // given back as its bytes are written.
    let bytes = data(3 * MIB, 4);
    let mut writer = store.create_streamed(ObjectId(8, 3), 3 * MIB).unwrap();
    writer.write_at(MIB, &bytes[MIB as usize..]).unwrap();
    writer.write_at(0, &bytes[..MIB as usize]).unwrap();
    writer.seal(crc32c::crc32c(&bytes)).unwrap();
    assert_eq!(store.get(ObjectId(8, 3)).unwrap().as_slice(), &bytes[..]);
    store.delete(ObjectId(8, 3)).unwrap();
    store.sanity_check().unwrap();
    assert!(files(store.memory_dir()).is_empty());
    assert_eq!(store.usage().writing_bytes, 0);
}

#[test]
fn a_sealed_object_keeps_its_block_sums_when_written_in_order() {
    // A holder sends these as its chunks' checksums instead of summing each chunk again.
    let f = fixture(64 * MIB);
    let bytes = data(5 * MIB + 123, 11);
    let expected: Vec<u32> = bytes.chunks(MIB as usize).map(crc32c::crc32c).collect();
    let sums = |id| f.store.get(id).unwrap().block_sums().map(|s| s.to_vec());
    // Chunks checked by a fetch, summed by the caller.
    let mut w = f
        .store
        .create_streamed(ObjectId(20, 0), bytes.len() as u64)
        .unwrap();
    for (i, piece) in bytes.chunks(MIB as usize).enumerate() {
        w.write_summed(i as u64 * MIB, piece, crc32c::crc32c(piece))
            .unwrap();
    }
    w.seal(crc32c::crc32c(&bytes)).unwrap();
    assert_eq!(sums(ObjectId(20, 0)), Some(expected.clone()));
    // Appended in pieces that do not fall on the blocks (a put): summed here, block by block.
    let mut w = f.store.create(ObjectId(20, 1), bytes.len() as u64).unwrap();
    for piece in bytes.chunks(700_001) {
        w.append(piece).unwrap();
    }
    w.seal(crc32c::crc32c(&bytes)).unwrap();
    assert_eq!(sums(ObjectId(20, 1)), Some(expected));
    // Out of order, or summed pieces across a block's end: none kept (the holder sums).
    let mut w = f.store.create(ObjectId(20, 2), bytes.len() as u64).unwrap();
    w.write_at(MIB, &bytes[MIB as usize..]).unwrap();
    w.write_at(0, &bytes[..MIB as usize]).unwrap();
    w.seal(crc32c::crc32c(&bytes)).unwrap();
    assert_eq!(sums(ObjectId(20, 2)), None);
    let mut w = f.store.create(ObjectId(20, 3), bytes.len() as u64).unwrap();
    let (a, b) = bytes.split_at(MIB as usize + 1);
    w.write_summed(0, a, crc32c::crc32c(a)).unwrap();
    w.write_summed(a.len() as u64, b, crc32c::crc32c(b))
        .unwrap();
    w.seal(crc32c::crc32c(&bytes)).unwrap();
    assert_eq!(sums(ObjectId(20, 3)), None);
    // Empty: no blocks.
    let w = f.store.create(ObjectId(20, 4), 0).unwrap();
    w.seal(0).unwrap();
    assert_eq!(sums(ObjectId(20, 4)), Some(vec![]));
}

#[test]
fn a_dropped_store_removes_its_directories_after_its_last_reader() {
    let f = fixture(MIB);
    put(&f.store, ObjectId(9, 0), &data(MIB, 1));
    put(&f.store, ObjectId(9, 1), &data(MIB / 2, 2)); // spills 9.0
    let view = f.store.get(ObjectId(9, 1)).unwrap();
    let writer = f.store.create(ObjectId(9, 2), 10).unwrap();
    let (memory, spill) = (
        f.store.memory_dir().to_path_buf(),
        f.store.spill_dir().to_path_buf(),
    );
    let Fixture {
        store,
        memory_root,
        spill_root,
    } = f;
    drop(store);
    assert!(memory.exists() && spill.exists(), "removed under a reader");
    assert!(view.as_slice() == data(MIB / 2, 2).as_slice());
    drop(writer);
    drop(view);
    assert!(!memory.exists() && !spill.exists());
    assert!(files(memory_root.path()).is_empty() && files(spill_root.path()).is_empty());
}

#[test]
fn stores_left_by_dead_workers_are_swept_at_open() {
    let memory_root = tempfile::tempdir_in("/dev/shm").unwrap();
    let spill_root = tempfile::tempdir().unwrap();
    // No process has pid 4000000000 (pid_max is at most 2^22).
    let dead = memory_root.path().join("escher-objects-4000000000-0");
    let dead_spill = spill_root.path().join("escher-spill-4000000000-3");
    for dir in [&dead, &dead_spill] {
        std::fs::create_dir(dir).unwrap();
        std::fs::write(dir.join("1.0.1"), data(MIB, 1)).unwrap();
    }
    // Kept: this process's other store, a live process's (pid 1), and what is not a store.
    let own = memory_root.path().join(format!(
        "escher-objects-{}-999999",
        crate::pidns::host_pid()
    ));
    let live = memory_root.path().join("escher-objects-1-0");
    let other = memory_root.path().join("escher-objects-notapid");
    for dir in [&own, &live, &other] {
        std::fs::create_dir(dir).unwrap();
    }
    let store = ObjectStore::open(StoreConfig {
        capacity: MIB,
        memory_root: memory_root.path().to_path_buf(),
        spill_root: spill_root.path().to_path_buf(),
    })
    .unwrap();
    assert!(!dead.exists() && !dead_spill.exists());
    assert!(own.exists() && live.exists() && other.exists());
    assert_eq!(
        files(spill_root.path()).len(),
        1,
        "only the new store's spill directory"
    );
    assert!(store.memory_dir().parent() == Some(memory_root.path()));
}

#[test]
fn an_unusable_root_is_refused() {
    let e = ObjectStore::open(StoreConfig {
        capacity: MIB,
        memory_root: "/nonexistent/escher".into(),
        spill_root: std::env::temp_dir(),
    })
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("/nonexistent/escher: not a directory"),
        "{e}"
    );
}

#[test]
fn concurrent_writers_and_readers_keep_the_store_consistent() {
    let f = fixture(MIB);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let store = f.store.clone();
            s.spawn(move || {
                for i in 0..40u64 {
                    let id = ObjectId(10 + t, i);
                    let bytes = data(64 * 1024 + i * 1000, t * 100 + i);
                    put(&store, id, &bytes);
                    let earlier = ObjectId(10 + t, i / 2);
                    if let Ok(view) = store.get(earlier) {
                        assert_eq!(view.len(), 64 * 1024 + (i / 2) * 1000);
                        assert_eq!(crc32c::crc32c(view.as_slice()), view.crc32c());
                    }
                    if i % 3 == 0 {
                        store.delete(id).unwrap();
                    }
                }
            });
        }
    });
    f.check();
    for status in f.store.list() {
        f.store.delete(status.info.id).unwrap();
    }
    f.check();
    assert_eq!(
        f.store.usage(),
        StoreUsage {
            capacity: MIB,
            ..StoreUsage::default()
        }
    );
}

#[test]
fn handles_cross_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<ObjectStore>();
    shared::<ObjectWriter>();
    shared::<ObjectView>();
}

#[test]
fn a_copy_is_dropped_by_its_number_only_and_a_copy_stored_again_stays() {
    let f = fixture(8 * MIB);
    let (old, again) = (ObjectId(7, 0), ObjectId(7, 1));
    put(&f.store, old, &data(MIB, 1));
    put(&f.store, again, &data(MIB, 2));
    put(&f.store, ObjectId(8, 0), &data(MIB, 3));
    let copies = f.store.copies();
    let ids: Vec<ObjectId> = copies.iter().map(|(info, _)| info.id).collect();
    assert_eq!(ids, vec![old, again, ObjectId(8, 0)]);
    let number = |id: ObjectId| copies.iter().find(|(i, _)| i.id == id).unwrap().1;
    // `again` is written anew (a later attempt's result): its old number names nothing.
    f.store.delete(again).unwrap();
    put(&f.store, again, &data(MIB, 4));
    assert!(!f.store.delete_copy(again, number(again)).unwrap());
    assert!(f.store.contains(again));
    // The copy reported is the one held: it goes, with its bytes.
    assert!(f.store.delete_copy(old, number(old)).unwrap());
    assert!(!f.store.contains(old));
    assert!(!f.store.delete_copy(old, number(old)).unwrap());
    assert_eq!(f.store.usage().memory_bytes, 2 * MIB);
    f.check();
}
