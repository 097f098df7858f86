//! The three NDP applications of the paper (§3), with real computation.
//!
//! Each is a pipeline of two processing engines (stages) that the SmartNIC
//! runs on its cores, and a CN version that the compute node runs when a
//! request is forwarded to it or when there is no NDP at all. Both give
//! byte-identical results.
//!
//! - **MVS** (multi-version storage): a CRC-32 consistency check of the
//!   stored record, then serialisation of the version found.
//! - **Spark-style analysis**: a top-K spatial join of two point sets held
//!   in the record, then serialisation of the joined pairs. The paper
//!   cites a Spark top-K spatial join; the grid join used here is
//!   Remora's choice.
//! - **IPSec**: SHA-256 verification of the packet, then AES-128-CTR
//!   decryption. The paper names "SHA and AES engines"; SHA-256 and CTR
//!   mode are Remora's choices.
//!
//! Records are built by [`App::make_payload`], deterministically from a
//! request id, so the simulator can run any sampled request for real.

use aes::cipher::{KeyIvInit, StreamCipher};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The smallest payload an application accepts.
pub const MIN_PAYLOAD_BYTES: usize = 64;
/// The largest payload an application accepts.
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024;
/// The default payload of the paper's evaluation (§5.1).
pub const DEFAULT_PAYLOAD_BYTES: usize = 1024;

/// The NDP applications.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum App {
    Mvs,
    Spark,
    Ipsec,
}

/// A stage (processing engine) of an application's pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    CrcCheck,
    MvsSerialise,
    SpatialJoin,
    JoinSerialise,
    ShaVerify,
    AesDecrypt,
}

/// Why a stage refused its input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StageError {
    #[error("{stage:?}: input of {length} bytes is shorter than {minimum}")]
    TooShort {
        stage: Stage,
        length: usize,
        minimum: usize,
    },
    #[error("MVS record fails its CRC: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch { stored: u32, computed: u32 },
    #[error("IPSec packet fails SHA-256 verification")]
    DigestMismatch,
    #[error("spatial-join record holds {declared} points in {available} bytes")]
    BadPointCount { declared: usize, available: usize },
    #[error("serialisation: {0}")]
    Serialise(String),
}

/// A payload size outside what applications accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("payload of {0} bytes is outside {MIN_PAYLOAD_BYTES}..={MAX_PAYLOAD_BYTES}")]
pub struct PayloadSizeError(pub usize);

impl App {
    pub const ALL: [App; 3] = [App::Mvs, App::Spark, App::Ipsec];

    pub fn name(self) -> &'static str {
        match self {
            App::Mvs => "mvs",
            App::Spark => "spark",
            App::Ipsec => "ipsec",
        }
    }

    /// The flag a CN passes to name the application (§4.3's NDP type).
    pub fn type_flag(self) -> u8 {
        match self {
            App::Mvs => 1,
            App::Spark => 2,
            App::Ipsec => 3,
        }
    }

    pub fn from_type_flag(flag: u8) -> Option<App> {
        App::ALL.into_iter().find(|app| app.type_flag() == flag)
    }

    pub fn from_name(name: &str) -> Option<App> {
        App::ALL.into_iter().find(|app| app.name() == name)
    }

    /// The pipeline the SmartNIC runs, in order.
    pub fn stages(self) -> &'static [Stage] {
        match self {
            App::Mvs => &[Stage::CrcCheck, Stage::MvsSerialise],
            App::Spark => &[Stage::SpatialJoin, Stage::JoinSerialise],
            App::Ipsec => &[Stage::ShaVerify, Stage::AesDecrypt],
        }
    }

    /// A valid record of `bytes` bytes for request `id`: the same id and
    /// seed always give the same bytes.
    pub fn make_payload(
        self,
        seed: u64,
        id: u64,
        bytes: usize,
    ) -> Result<Vec<u8>, PayloadSizeError> {
        if !(MIN_PAYLOAD_BYTES..=MAX_PAYLOAD_BYTES).contains(&bytes) {
            return Err(PayloadSizeError(bytes));
        }
        let mut random = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ id.rotate_left(17));
        Ok(match self {
            App::Mvs => mvs::record(&mut random, id, bytes),
            App::Spark => spark::record(&mut random, bytes),
            App::Ipsec => ipsec::packet(&mut random, bytes),
        })
    }

    /// The SmartNIC's path: every stage in turn, each on the previous
    /// stage's output.
    pub fn run_pipeline(self, payload: &[u8]) -> Result<Vec<u8>, StageError> {
        let mut input = payload.to_vec();
        let mut output = Vec::with_capacity(payload.len() + 64);
        for stage in self.stages() {
            output.clear();
            stage.run(&input, &mut output)?;
            std::mem::swap(&mut input, &mut output);
        }
        Ok(input)
    }

    /// The CN version: one pass, run to completion on a CPU core, with no
    /// intermediate buffer between stages.
    pub fn run_on_cpu(self, payload: &[u8]) -> Result<Vec<u8>, StageError> {
        match self {
            App::Mvs => {
                let content = mvs::checked_content(payload)?;
                mvs::serialise(content)
            }
            App::Spark => {
                let pairs = spark::join(payload)?;
                spark::serialise_pairs(pairs.iter().copied())
            }
            App::Ipsec => {
                let mut plaintext = ipsec::verified(payload)?.to_vec();
                ipsec::decrypt_in_place(&mut plaintext);
                Ok(plaintext.split_off(ipsec::NONCE_BYTES))
            }
        }
    }
}

impl Stage {
    pub fn name(self) -> &'static str {
        match self {
            Stage::CrcCheck => "crc_check",
            Stage::MvsSerialise => "mvs_serialise",
            Stage::SpatialJoin => "spatial_join",
            Stage::JoinSerialise => "join_serialise",
            Stage::ShaVerify => "sha_verify",
            Stage::AesDecrypt => "aes_decrypt",
        }
    }

    /// Runs the stage's real code over `input`, appending to `output`.
    pub fn run(self, input: &[u8], output: &mut Vec<u8>) -> Result<(), StageError> {
        self.run_with(input, output, mvs::crc_detected)
    }

    /// The same stage with only portable code, as a SoC core runs it: the
    /// prototype's five-stage RISC-V core has no carry-less multiply
    /// (PCLMULQDQ), which crc32fast uses here when the CPU has it. The
    /// results are the same bytes; only the cost differs, and calibration
    /// times this version for the SoC. (SHA-256 is built portable for
    /// both: the paper's Xeon Gold 5117 has no SHA extensions either. AES
    /// keeps AES-NI: an optimistic SoC cost, said in the report.)
    pub fn run_portable(self, input: &[u8], output: &mut Vec<u8>) -> Result<(), StageError> {
        self.run_with(input, output, mvs::crc_portable)
    }

    fn run_with(
        self,
        input: &[u8],
        output: &mut Vec<u8>,
        crc: fn(&[u8]) -> u32,
    ) -> Result<(), StageError> {
        match self {
            Stage::CrcCheck => output.extend_from_slice(mvs::checked_content_with(input, crc)?),
            Stage::MvsSerialise => output.extend_from_slice(&mvs::serialise(input)?),
            Stage::SpatialJoin => {
                for pair in spark::join(input)? {
                    pair.write(output);
                }
            }
            Stage::JoinSerialise => {
                let pairs = input.chunks_exact(spark::PAIR_BYTES).map(spark::Pair::read);
                output.extend_from_slice(&spark::serialise_pairs(pairs)?);
            }
            Stage::ShaVerify => output.extend_from_slice(ipsec::verified(input)?),
            Stage::AesDecrypt => {
                if input.len() < ipsec::NONCE_BYTES {
                    return Err(StageError::TooShort {
                        stage: self,
                        length: input.len(),
                        minimum: ipsec::NONCE_BYTES,
                    });
                }
                let mut packet = input.to_vec();
                ipsec::decrypt_in_place(&mut packet);
                output.extend_from_slice(&packet[ipsec::NONCE_BYTES..]);
            }
        }
        Ok(())
    }
}

mod mvs {
    use super::*;

    /// Key, version, then the value; a CRC-32 of all of it last.
    const HEADER_BYTES: usize = 16;
    const CRC_BYTES: usize = 4;

    #[derive(Serialize)]
    struct VersionReply<'a> {
        key: u64,
        version: u64,
        #[serde(with = "serde_bytes_slice")]
        value: &'a [u8],
    }

    /// Serialises a byte slice as a length-prefixed run of bytes.
    mod serde_bytes_slice {
        pub fn serialize<S: serde::Serializer>(
            bytes: &[u8],
            serializer: S,
        ) -> Result<S::Ok, S::Error> {
            serializer.serialize_bytes(bytes)
        }
    }

    pub fn record(random: &mut impl Rng, id: u64, bytes: usize) -> Vec<u8> {
        let mut record = Vec::with_capacity(bytes);
        record.extend_from_slice(&id.to_le_bytes());
        record.extend_from_slice(&random.gen_range(1..1_000u64).to_le_bytes());
        record.resize(bytes - CRC_BYTES, 0);
        random.fill(&mut record[HEADER_BYTES..]);
        let crc = crc32fast::hash(&record);
        record.extend_from_slice(&crc.to_le_bytes());
        record
    }

    pub fn crc_detected(bytes: &[u8]) -> u32 {
        crc32fast::hash(bytes)
    }

    /// crc32fast's table-driven path, which it falls back to on CPUs
    /// without carry-less multiply.
    pub fn crc_portable(bytes: &[u8]) -> u32 {
        let mut hasher = crc32fast::Hasher::internal_new_baseline(0, 0);
        hasher.update(bytes);
        hasher.finalize()
    }

    pub fn checked_content(record: &[u8]) -> Result<&[u8], StageError> {
        checked_content_with(record, crc_detected)
    }

    pub fn checked_content_with(record: &[u8], crc: fn(&[u8]) -> u32) -> Result<&[u8], StageError> {
        let minimum = HEADER_BYTES + CRC_BYTES;
        if record.len() < minimum {
            return Err(StageError::TooShort {
                stage: Stage::CrcCheck,
                length: record.len(),
                minimum,
            });
        }
        let (content, stored_crc) = record.split_at(record.len() - CRC_BYTES);
        let stored = u32::from_le_bytes(stored_crc.try_into().expect("four bytes"));
        let computed = crc(content);
        if stored != computed {
            return Err(StageError::CrcMismatch { stored, computed });
        }
        Ok(content)
    }

    pub fn serialise(content: &[u8]) -> Result<Vec<u8>, StageError> {
        if content.len() < HEADER_BYTES {
            return Err(StageError::TooShort {
                stage: Stage::MvsSerialise,
                length: content.len(),
                minimum: HEADER_BYTES,
            });
        }
        let reply = VersionReply {
            key: u64::from_le_bytes(content[..8].try_into().expect("eight bytes")),
            version: u64::from_le_bytes(content[8..16].try_into().expect("eight bytes")),
            value: &content[HEADER_BYTES..],
        };
        bincode::serialize(&reply).map_err(|error| StageError::Serialise(error.to_string()))
    }
}

mod spark {
    use super::*;

    /// How many joined pairs the query keeps.
    const TOP_K: usize = 8;
    /// The join's grid: points within one cell of each other are candidates.
    const GRID_CELLS_PER_SIDE: usize = 16;
    /// Two counts, then the points of set A, then set B, each (x, y) as f32.
    const HEADER_BYTES: usize = 8;
    const POINT_BYTES: usize = 8;
    pub const PAIR_BYTES: usize = 12;

    #[derive(Debug, Clone, Copy, PartialEq, Serialize)]
    pub struct Pair {
        pub a: u32,
        pub b: u32,
        pub distance: f32,
    }

    impl Pair {
        pub fn write(&self, output: &mut Vec<u8>) {
            output.extend_from_slice(&self.a.to_le_bytes());
            output.extend_from_slice(&self.b.to_le_bytes());
            output.extend_from_slice(&self.distance.to_le_bytes());
        }

        pub fn read(bytes: &[u8]) -> Pair {
            let word = |at: usize| <[u8; 4]>::try_from(&bytes[at..at + 4]).expect("four bytes");
            Pair {
                a: u32::from_le_bytes(word(0)),
                b: u32::from_le_bytes(word(4)),
                distance: f32::from_le_bytes(word(8)),
            }
        }
    }

    pub fn record(random: &mut impl Rng, bytes: usize) -> Vec<u8> {
        let points = (bytes - HEADER_BYTES) / POINT_BYTES;
        let in_a = points / 2;
        let mut record = Vec::with_capacity(bytes);
        record.extend_from_slice(&(in_a as u32).to_le_bytes());
        record.extend_from_slice(&((points - in_a) as u32).to_le_bytes());
        for _ in 0..points * 2 {
            record.extend_from_slice(&random.gen::<f32>().to_le_bytes());
        }
        record.resize(bytes, 0);
        record
    }

    fn points(record: &[u8], first: usize, count: usize) -> impl Iterator<Item = (f32, f32)> + '_ {
        record[HEADER_BYTES + first * POINT_BYTES..]
            .chunks_exact(POINT_BYTES)
            .take(count)
            .map(|point| {
                let x = f32::from_le_bytes(point[..4].try_into().expect("four bytes"));
                let y = f32::from_le_bytes(point[4..].try_into().expect("four bytes"));
                (x, y)
            })
    }

    fn cell(coordinate: f32) -> usize {
        // Points outside the unit square (a malformed record) clamp to the
        // border cells rather than index out of the grid.
        ((coordinate.clamp(0.0, 1.0) * GRID_CELLS_PER_SIDE as f32) as usize)
            .min(GRID_CELLS_PER_SIDE - 1)
    }

    /// The K closest pairs (a from A, b from B) whose cells touch, closest
    /// first, ties by index: a grid hash join, then a bounded top-K.
    pub fn join(record: &[u8]) -> Result<Vec<Pair>, StageError> {
        if record.len() < HEADER_BYTES {
            return Err(StageError::TooShort {
                stage: Stage::SpatialJoin,
                length: record.len(),
                minimum: HEADER_BYTES,
            });
        }
        let count = |at: usize| {
            u32::from_le_bytes(record[at..at + 4].try_into().expect("four bytes")) as usize
        };
        let (in_a, in_b) = (count(0), count(4));
        let available = (record.len() - HEADER_BYTES) / POINT_BYTES;
        if in_a
            .checked_add(in_b)
            .is_none_or(|declared| declared > available)
        {
            return Err(StageError::BadPointCount {
                declared: in_a.saturating_add(in_b),
                available,
            });
        }
        // Set A bucketed by cell with a counting sort: `starts[c]..starts[c + 1]`
        // indexes cell c's points in `bucketed`.
        const CELLS: usize = GRID_CELLS_PER_SIDE * GRID_CELLS_PER_SIDE;
        let cell_of = |x: f32, y: f32| cell(y) * GRID_CELLS_PER_SIDE + cell(x);
        let mut starts = [0u32; CELLS + 1];
        for (x, y) in points(record, 0, in_a) {
            starts[cell_of(x, y) + 1] += 1;
        }
        for index in 0..CELLS {
            starts[index + 1] += starts[index];
        }
        let mut next = starts;
        let mut bucketed = vec![(0u32, 0f32, 0f32); in_a];
        for (index, (x, y)) in points(record, 0, in_a).enumerate() {
            let slot = &mut next[cell_of(x, y)];
            bucketed[*slot as usize] = (index as u32, x, y);
            *slot += 1;
        }
        let mut best: Vec<Pair> = Vec::with_capacity(TOP_K + 1);
        for (b_index, (x, y)) in points(record, in_a, in_b).enumerate() {
            let (column, row) = (cell(x), cell(y));
            for near_row in row.saturating_sub(1)..=(row + 1).min(GRID_CELLS_PER_SIDE - 1) {
                for near_column in
                    column.saturating_sub(1)..=(column + 1).min(GRID_CELLS_PER_SIDE - 1)
                {
                    let near = near_row * GRID_CELLS_PER_SIDE + near_column;
                    for &(a_index, a_x, a_y) in
                        &bucketed[starts[near] as usize..starts[near + 1] as usize]
                    {
                        let distance = ((a_x - x).powi(2) + (a_y - y).powi(2)).sqrt();
                        keep_best(
                            &mut best,
                            Pair {
                                a: a_index,
                                b: b_index as u32,
                                distance,
                            },
                        );
                    }
                }
            }
        }
        Ok(best)
    }

    fn keep_best(best: &mut Vec<Pair>, candidate: Pair) {
        let key = |pair: &Pair| (pair.distance, pair.a, pair.b);
        let position = best.partition_point(|kept| key(kept) < key(&candidate));
        if position < TOP_K {
            best.insert(position, candidate);
            best.truncate(TOP_K);
        }
    }

    pub fn serialise_pairs(pairs: impl Iterator<Item = Pair>) -> Result<Vec<u8>, StageError> {
        let pairs: Vec<Pair> = pairs.collect();
        bincode::serialize(&pairs).map_err(|error| StageError::Serialise(error.to_string()))
    }
}

mod ipsec {
    use super::*;

    /// The counter block's initial value, sent in the clear.
    pub const NONCE_BYTES: usize = 16;
    const DIGEST_BYTES: usize = 32;
    /// The security association's key: both ends know it.
    const KEY: [u8; 16] = *b"remora-tiga-sa-k";

    type Cipher = ctr::Ctr128BE<aes::Aes128>;

    /// Nonce, ciphertext, then SHA-256 of both.
    pub fn packet(random: &mut impl Rng, bytes: usize) -> Vec<u8> {
        let mut packet = vec![0u8; bytes - DIGEST_BYTES];
        random.fill(&mut packet[..]);
        // Encryption is its own inverse in CTR mode.
        decrypt_in_place(&mut packet);
        let digest = Sha256::digest(&packet);
        packet.extend_from_slice(&digest);
        packet
    }

    /// The nonce and ciphertext, once the digest checks.
    pub fn verified(packet: &[u8]) -> Result<&[u8], StageError> {
        let minimum = NONCE_BYTES + DIGEST_BYTES;
        if packet.len() < minimum {
            return Err(StageError::TooShort {
                stage: Stage::ShaVerify,
                length: packet.len(),
                minimum,
            });
        }
        let (body, digest) = packet.split_at(packet.len() - DIGEST_BYTES);
        if Sha256::digest(body).as_slice() != digest {
            return Err(StageError::DigestMismatch);
        }
        Ok(body)
    }

    /// Decrypts the ciphertext after the nonce, in place.
    pub fn decrypt_in_place(packet: &mut [u8]) {
        let (nonce, body) = packet.split_at_mut(NONCE_BYTES);
        let mut cipher = Cipher::new(&KEY.into(), (&*nonce).into());
        cipher.apply_keystream(body);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_app_gives_the_same_bytes_on_the_nic_and_the_cn() {
        for app in App::ALL {
            for bytes in [MIN_PAYLOAD_BYTES, 200, DEFAULT_PAYLOAD_BYTES, 4096] {
                for id in 0..20 {
                    let payload = app.make_payload(7, id, bytes).unwrap();
                    let on_nic = app.run_pipeline(&payload).unwrap();
                    let on_cpu = app.run_on_cpu(&payload).unwrap();
                    assert_eq!(on_nic, on_cpu, "{app:?} id {id} at {bytes} B");
                    assert!(!on_nic.is_empty());
                }
            }
        }
    }

    #[test]
    fn a_corrupted_record_is_refused_on_both_paths() {
        for app in App::ALL {
            let mut payload = app.make_payload(1, 3, DEFAULT_PAYLOAD_BYTES).unwrap();
            let last = payload.len() - 1;
            payload[last] ^= 0x40;
            if app == App::Spark {
                // Spark's record has no integrity check: a flipped bit in
                // the padding changes nothing, one in the counts is refused.
                payload[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
                assert!(matches!(
                    app.run_pipeline(&payload),
                    Err(StageError::BadPointCount { .. })
                ));
            } else {
                assert!(app.run_pipeline(&payload).is_err());
            }
            assert_eq!(
                app.run_pipeline(&payload).err(),
                app.run_on_cpu(&payload).err()
            );
        }
    }

    #[test]
    fn the_portable_stages_give_the_same_bytes() {
        for app in App::ALL {
            let payload = app.make_payload(3, 4, DEFAULT_PAYLOAD_BYTES).unwrap();
            let mut input = payload.clone();
            for stage in app.stages() {
                let (mut fast, mut portable) = (Vec::new(), Vec::new());
                stage.run(&input, &mut fast).unwrap();
                stage.run_portable(&input, &mut portable).unwrap();
                assert_eq!(fast, portable, "{stage:?}");
                input = fast;
            }
        }
    }

    #[test]
    fn ipsec_decrypts_to_what_was_encrypted() {
        let payload = App::Ipsec.make_payload(5, 9, 256).unwrap();
        let plaintext = App::Ipsec.run_on_cpu(&payload).unwrap();
        assert_eq!(plaintext.len(), 256 - 16 - 32);
        // The ciphertext differs from the plaintext (the stage did work).
        assert_ne!(&payload[16..16 + plaintext.len()], &plaintext[..]);
    }

    #[test]
    fn the_spatial_join_finds_the_closest_pair_a_brute_force_finds() {
        let payload = App::Spark.make_payload(11, 1, 2048).unwrap();
        let pairs = spark::join(&payload).unwrap();
        let in_a = u32::from_le_bytes(payload[0..4].try_into().unwrap()) as usize;
        let in_b = u32::from_le_bytes(payload[4..8].try_into().unwrap()) as usize;
        let all: Vec<(f32, f32)> = spark_points(&payload, in_a + in_b);
        let mut closest = f32::MAX;
        for a in &all[..in_a] {
            for b in &all[in_a..] {
                closest = closest.min(((a.0 - b.0).powi(2) + (a.1 - b.1).powi(2)).sqrt());
            }
        }
        assert_eq!(pairs[0].distance, closest);
        assert!(pairs
            .windows(2)
            .all(|two| two[0].distance <= two[1].distance));
    }

    fn spark_points(payload: &[u8], count: usize) -> Vec<(f32, f32)> {
        payload[8..]
            .chunks_exact(8)
            .take(count)
            .map(|p| {
                (
                    f32::from_le_bytes(p[..4].try_into().unwrap()),
                    f32::from_le_bytes(p[4..].try_into().unwrap()),
                )
            })
            .collect()
    }

    #[test]
    fn payload_sizes_out_of_range_are_refused() {
        assert_eq!(App::Mvs.make_payload(0, 0, 10), Err(PayloadSizeError(10)));
        assert!(App::Mvs.make_payload(0, 0, MAX_PAYLOAD_BYTES + 1).is_err());
    }

    #[test]
    fn type_flags_round_trip() {
        for app in App::ALL {
            assert_eq!(App::from_type_flag(app.type_flag()), Some(app));
            assert_eq!(App::from_name(app.name()), Some(app));
        }
        assert_eq!(App::from_type_flag(0), None);
    }
}
