//! The YCSB generator: presets, property files and their errors, the
//! operation mix, and the key distributions against their formulas.

use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use remora_workloads::distribution::{KeyChooser, Zipfian};
use remora_workloads::ycsb::{
    Generator, Mix, Operation, RequestDistribution, WorkloadError, WorkloadSpec,
};

/// Written in the style of YCSB's own `workloads/workloada`.
const WORKLOAD_FILE: &str = "\
# Yahoo! Cloud System Benchmark
# Workload A: Update heavy workload
recordcount=1000
operationcount=1000
workload=site.ycsb.workloads.CoreWorkload

readallfields=true

readproportion=0.5
updateproportion=0.5
scanproportion=0
insertproportion=0

requestdistribution=zipfian
! a comment in the other style
zipfianconstant: 0.75
";

#[test]
fn a_ycsb_property_file_reads_as_its_mix_and_distribution() {
    let spec = WorkloadSpec::from_properties(WORKLOAD_FILE).unwrap();
    assert_eq!((spec.record_count, spec.operation_count), (1000, 1000));
    assert_eq!(
        (spec.mix.read, spec.mix.update, spec.mix.insert),
        (0.5, 0.5, 0.0)
    );
    assert_eq!(spec.distribution, RequestDistribution::Zipfian);
    assert_eq!(spec.zipfian_constant, 0.75);
    assert_eq!(
        spec.properties["workload"],
        "site.ycsb.workloads.CoreWorkload"
    );
}

/// YCSB's CoreWorkload gives each proportion its own default (reads
/// 0.95, updates 0.05, the rest 0) and draws operations by weight, so a
/// file's mix is its proportions over their sum.
#[test]
fn proportions_default_one_by_one_and_weigh_as_ycsb_weighs_them() {
    let mix = |text: &str| {
        let mix = WorkloadSpec::from_properties(text).unwrap().mix;
        (
            mix.read,
            mix.update,
            mix.insert,
            mix.scan,
            mix.read_modify_write,
        )
    };
    assert_eq!(mix(""), (0.95, 0.05, 0.0, 0.0, 0.0));
    let (read, update, ..) = mix("readproportion=0.5");
    assert!((read - 0.5 / 0.55).abs() < 1e-12, "{read}");
    assert!((update - 0.05 / 0.55).abs() < 1e-12, "{update}");
    let (read, update, insert, ..) =
        mix("readproportion=0.5\nupdateproportion=0.4\ninsertproportion=0.1");
    assert_eq!((read, update), (0.5, 0.4));
    assert!((insert - 0.1).abs() < 1e-12);
    let (read, update, ..) = mix("readproportion=0.3\nupdateproportion=0.3");
    assert_eq!((read, update), (0.5, 0.5));
    // Weights past 1 are weights too, as YCSB takes them.
    let (read, update, ..) = mix("readproportion=2\nupdateproportion=2");
    assert_eq!((read, update), (0.5, 0.5));
}

#[test]
fn the_presets_are_ycsbs_core_workloads() {
    let mix = |name: &str| {
        let spec = WorkloadSpec::preset(name).unwrap();
        let mix = spec.mix;
        (
            mix.read,
            mix.update,
            mix.insert,
            mix.scan,
            mix.read_modify_write,
            spec.distribution,
        )
    };
    assert_eq!(
        mix("a"),
        (0.5, 0.5, 0.0, 0.0, 0.0, RequestDistribution::Zipfian)
    );
    assert_eq!(
        mix("workloadb"),
        (0.95, 0.05, 0.0, 0.0, 0.0, RequestDistribution::Zipfian)
    );
    assert_eq!(
        mix("C"),
        (1.0, 0.0, 0.0, 0.0, 0.0, RequestDistribution::Zipfian)
    );
    assert_eq!(
        mix("d"),
        (0.95, 0.0, 0.05, 0.0, 0.0, RequestDistribution::Latest)
    );
    assert_eq!(
        mix("e"),
        (0.0, 0.0, 0.05, 0.95, 0.0, RequestDistribution::Zipfian)
    );
    assert_eq!(
        mix("f"),
        (0.5, 0.0, 0.0, 0.0, 0.5, RequestDistribution::Zipfian)
    );
    assert!(matches!(
        WorkloadSpec::preset("g"),
        Err(WorkloadError::UnknownPreset(_))
    ));
}

#[test]
fn bad_property_files_get_typed_errors() {
    let cases = [
        ("readproportion=0\nupdateproportion=0", "sum to 0"),
        ("readproportion=lots", "not a number"),
        (
            "readproportion=1\nrequestdistribution=gaussian",
            "not uniform, zipfian or latest",
        ),
        (
            "readproportion=1\nrequestdistribution=zipfian\nzipfianconstant=-1",
            "zipfian constant",
        ),
        ("readproportion=1\nrecordcount=0", "keyspace"),
        ("this line has no separator", "line 1"),
        ("readproportion=-0.5", "negative"),
    ];
    for (text, expected) in cases {
        let error = WorkloadSpec::from_properties(text).unwrap_err().to_string();
        assert!(
            error.contains(expected),
            "{text:?}: {error:?} lacks {expected:?}"
        );
    }
}

#[test]
fn the_same_seed_gives_the_same_operations_and_the_mix_holds() {
    let spec = WorkloadSpec::preset("a").unwrap();
    let first: Vec<Operation> = Generator::new(spec.clone(), 7)
        .unwrap()
        .take(1000)
        .collect();
    let again: Vec<Operation> = Generator::new(spec.clone(), 7)
        .unwrap()
        .take(1000)
        .collect();
    let other: Vec<Operation> = Generator::new(spec.clone(), 8)
        .unwrap()
        .take(1000)
        .collect();
    assert_eq!(first, again);
    assert_ne!(first, other);
    let reads = Generator::new(spec, 1)
        .unwrap()
        .take(100_000)
        .filter(|operation| matches!(operation, Operation::Read { .. }))
        .count();
    assert!(
        (49_000..51_000).contains(&reads),
        "{reads} reads in 100 000 of a 50/50 mix"
    );
}

#[test]
fn inserts_take_new_keys_in_order_and_latest_favours_them() {
    let mut generator = Generator::new(WorkloadSpec::preset("d").unwrap(), 3).unwrap();
    let mut next_insert = generator.loaded_keys().end;
    let mut recent_reads = 0;
    let mut reads = 0;
    for _ in 0..20_000 {
        match generator.next_operation().unwrap() {
            Operation::Insert { key } => {
                assert_eq!(key, next_insert);
                next_insert += 1;
            }
            Operation::Read { key } => {
                assert!(key < next_insert);
                reads += 1;
                if key + 10 >= next_insert {
                    recent_reads += 1;
                }
            }
            other => panic!("workload D has no {other:?}"),
        }
    }
    assert!(next_insert > 1000 + 800, "about 5 % inserts");
    // Under uniform choice 10 keys of ~1500 would get under 1 % of reads.
    assert!(
        recent_reads * 4 > reads,
        "{recent_reads} of {reads} reads hit the 10 newest keys"
    );
}

/// "Latest" drew a rank of a zipfian over the loaded keys and took it
/// modulo the keys inserted so far: no read ever reached a key older than
/// the newest `record_count`. It spans every key inserted now, as YCSB's.
#[test]
fn latest_reaches_keys_older_than_the_record_count() {
    let mut spec = WorkloadSpec::preset("d").unwrap();
    spec.record_count = 100;
    spec.operation_count = 40_000;
    spec.mix = Mix {
        read: 0.5,
        update: 0.0,
        insert: 0.5,
        scan: 0.0,
        read_modify_write: 0.0,
    };
    let mut generator = Generator::new(spec, 5).unwrap();
    let mut inserted = generator.loaded_keys().end;
    let mut old_reads = 0;
    for _ in 0..20_000 {
        match generator.next_operation().unwrap() {
            Operation::Insert { key } => inserted = key + 1,
            Operation::Read { key } => old_reads += u64::from(key + 100 < inserted),
            other => panic!("no {other:?} in this mix"),
        }
    }
    assert!(old_reads > 0, "no read reached past the newest 100 keys");
}

#[test]
fn zipfian_ranks_follow_their_probabilities() {
    for theta in [0.75, 0.99, 1.2] {
        let zipfian = Zipfian::new(1000, theta, false).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let draws = 400_000;
        let mut counts = [0u64; 4];
        for _ in 0..draws {
            let rank = zipfian.next_rank(&mut rng);
            assert!(rank < 1000);
            if rank < 4 {
                counts[rank as usize] += 1;
            }
        }
        for (rank, count) in counts.iter().enumerate() {
            let expected = zipfian.probability(rank as u64) * draws as f64;
            let error = (*count as f64 - expected).abs() / expected;
            assert!(
                error < 0.05,
                "θ {theta}, rank {rank}: {count} draws, expected {expected:.0}"
            );
        }
    }
}

#[test]
fn scrambled_zipfian_spreads_the_hot_keys_and_names_them() {
    let zipfian = Zipfian::new(10_000, 0.99, true).unwrap();
    let hottest = zipfian.hottest(8);
    assert_eq!(hottest.len(), 8);
    assert!(
        hottest
            .windows(2)
            .any(|pair| pair[0].abs_diff(pair[1]) > 100),
        "hot keys are not neighbours: {hottest:?}"
    );
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let hits = (0..100_000)
        .filter(|_| zipfian.next_key(&mut rng) == hottest[0])
        .count();
    let expected = zipfian.probability(0) * 100_000.0;
    assert!(
        (hits as f64) >= expected * 0.95,
        "{hits} draws of the hottest key, expected about {expected:.0}"
    );
}

#[test]
fn uniform_choice_covers_the_keyspace() {
    let chooser = KeyChooser::uniform(100).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let mut seen = [false; 100];
    for _ in 0..5000 {
        seen[chooser.next_key(100, &mut rng) as usize] = true;
    }
    assert!(seen.iter().all(|hit| *hit));
}

proptest! {
    #[test]
    fn keys_stay_in_the_keyspace(key_count in 1u64..5000, theta in 0.0f64..3.0, scrambled: bool, seed: u64) {
        let zipfian = Zipfian::new(key_count, theta, scrambled).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for _ in 0..64 {
            prop_assert!(zipfian.next_key(&mut rng) < key_count);
        }
    }
}

/// A spec's fields are public and callers change them after parsing: a
/// zero scan length, or an insert start at the top of the key space,
/// reached the generator and panicked (`gen_range(1..=0)`, an overflowing
/// key range). The generator now checks the spec as parsing does.
#[test]
fn a_spec_changed_after_parsing_is_checked_again() {
    let mut scans = WorkloadSpec::preset("e").unwrap();
    scans.max_scan_length = 0;
    assert!(matches!(
        Generator::new(scans, 1),
        Err(WorkloadError::Value { .. })
    ));
    let far = WorkloadSpec::from_properties("insertstart=18446744073709551615");
    assert!(matches!(far, Err(WorkloadError::Value { .. })), "{far:?}");
    let mut skewed = WorkloadSpec::preset("a").unwrap();
    skewed.mix.read = f64::NAN;
    assert!(matches!(
        Generator::new(skewed, 1),
        Err(WorkloadError::Proportions(_))
    ));
}

/// A zipfian spec with no loaded records passed every check (its key
/// span counts the inserts to come) and the first operation panicked
/// drawing a key among none. Every distribution refuses it now.
#[test]
fn a_spec_with_no_loaded_records_is_refused() {
    for distribution in ["zipfian", "uniform", "latest"] {
        let spec = WorkloadSpec::from_properties(&format!(
            "recordcount=0\nreadproportion=0\nupdateproportion=0\n\
             insertproportion=1\nrequestdistribution={distribution}"
        ));
        assert!(
            matches!(&spec, Err(WorkloadError::Value { key, .. }) if key == "recordcount"),
            "{distribution}: {spec:?}"
        );
    }
    let mut emptied = WorkloadSpec::preset("e").unwrap();
    emptied.record_count = 0;
    assert!(Generator::new(emptied, 1).is_err());
}

/// A generator runs past its spec's operation count (the KV store draws
/// as many as its duration needs): from an insert start near 2^64 the
/// insert counter overflowed, a panic in a debug build and wrapped keys
/// in a release one. The insert past the last key is a typed error, and
/// the iterator ends there.
#[test]
fn inserts_past_the_last_key_are_an_error_not_an_overflow() {
    let spec = WorkloadSpec::from_properties(
        "insertstart=18446744073709548615\nrecordcount=1000\n\
         readproportion=0\nupdateproportion=0\ninsertproportion=1\n\
         requestdistribution=uniform",
    )
    .unwrap();
    let mut generator = Generator::new(spec.clone(), 1).unwrap();
    let mut inserts = 0u64;
    let error = loop {
        match generator.next_operation() {
            Ok(Operation::Insert { key }) => {
                assert_eq!(key, spec.insert_start + spec.record_count + inserts);
                inserts += 1;
            }
            Ok(other) => panic!("only inserts in this mix, not {other:?}"),
            Err(error) => break error,
        }
        assert!(inserts <= 3000, "the keys never ran out");
    };
    assert!(matches!(error, WorkloadError::KeysExhausted), "{error:?}");
    assert_eq!(inserts, u64::MAX - spec.insert_start - spec.record_count);
    let again = Generator::new(spec, 1).unwrap();
    assert_eq!(again.count() as u64, inserts);
    // With reads in the mix, draws after the keys ran out still gave
    // reads: the iterator ends for good at the first refused insert.
    let mixed = WorkloadSpec::from_properties(
        "insertstart=18446744073709547615\nrecordcount=1000\n\
         readproportion=0.5\nupdateproportion=0\ninsertproportion=0.5\n\
         requestdistribution=uniform",
    )
    .unwrap();
    let mut generator = Generator::new(mixed, 1).unwrap();
    let before_the_end = generator.by_ref().count();
    assert!(before_the_end > 0);
    assert!(
        (0..16).all(|_| generator.next().is_none()),
        "ended for good"
    );
}

/// Under zipfian, inserted keys were never chosen: the chooser covered
/// the loaded keys only. It now spans the inserts expected, as YCSB's
/// does, and workload E's scans reach keys inserted during the run.
#[test]
fn zipfian_operations_reach_keys_inserted_during_the_run() {
    let mut spec = WorkloadSpec::preset("e").unwrap();
    spec.record_count = 1000;
    spec.operation_count = 20_000;
    let mut generator = Generator::new(spec, 7).unwrap();
    let reached_new = (0..20_000).any(|_| match generator.next_operation().unwrap() {
        Operation::Scan { key, .. } => key >= 1000,
        _ => false,
    });
    assert!(reached_new);
}

/// A theta a hair off 1 made the sampler draw past the last rank.
#[test]
fn a_theta_a_hair_off_one_is_one() {
    for theta in [1.0 - 1e-13, 1.0 + 1e-13] {
        let zipfian = Zipfian::new(1000, theta, false).unwrap();
        assert_eq!(zipfian.theta(), 1.0);
    }
    assert_eq!(Zipfian::new(1000, 0.99, false).unwrap().theta(), 0.99);
}
