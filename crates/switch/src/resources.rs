//! What a program uses, reported against Tofino-like budgets (as Cowbird's
//! Table 5 does).

use serde::Serialize;
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum TableKind {
    Exact,
    Ternary,
    LongestPrefix,
    Range,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TableResources {
    pub name: String,
    pub stage: u8,
    pub kind: TableKind,
    pub key_bits: u16,
    pub action_data_bits: u16,
    pub entries: usize,
    pub capacity: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RegisterResources {
    pub name: String,
    pub stage: u8,
    pub cells: usize,
    pub cell_bytes: usize,
}

impl RegisterResources {
    pub fn bytes(&self) -> usize {
        self.cells * self.cell_bytes
    }
}

/// The budget of one Tofino-1-like pipe, for comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Budget {
    pub stages: u8,
    pub register_bytes_per_stage: usize,
}

impl Budget {
    /// 12 stages; about 1 MiB of register SRAM per stage is a generous
    /// round figure for a Tofino 1 (80 SRAM blocks of 16 KiB each, shared
    /// with tables).
    pub const TOFINO1: Budget = Budget {
        stages: 12,
        register_bytes_per_stage: 1 << 20,
    };
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResourceReport {
    pub program: String,
    pub tables: Vec<TableResources>,
    pub registers: Vec<RegisterResources>,
    /// The most times one packet passes the pipeline again.
    pub max_recirculations_per_packet: u8,
    /// True if the program rewrites bytes the ICRC covers, so the
    /// deparser recomputes it. A Tofino cannot compute the ICRC; such a
    /// program needs a NIC or host to fix it up on real hardware.
    pub recomputes_icrc: bool,
    /// Frames the program's control plane may hold at once, to send back
    /// into the pipeline later (a packet-out). A Tofino holds none in its
    /// pipeline: these go to its CPU port and back, a round trip through
    /// the control plane per frame.
    pub control_plane_held_frames: usize,
}

impl ResourceReport {
    pub fn new(program: &str) -> ResourceReport {
        ResourceReport {
            program: program.to_string(),
            tables: Vec::new(),
            registers: Vec::new(),
            max_recirculations_per_packet: 0,
            recomputes_icrc: false,
            control_plane_held_frames: 0,
        }
    }

    pub fn stages_used(&self) -> u8 {
        let tables = self.tables.iter().map(|table| table.stage);
        let registers = self.registers.iter().map(|register| register.stage);
        tables.chain(registers).max().map_or(0, |last| last + 1)
    }

    pub fn table_entries(&self) -> usize {
        self.tables.iter().map(|table| table.entries).sum()
    }

    pub fn register_bytes(&self) -> usize {
        self.registers.iter().map(RegisterResources::bytes).sum()
    }

    /// Where the program exceeds `budget`, in words.
    pub fn over_budget(&self, budget: Budget) -> Vec<String> {
        let mut problems = Vec::new();
        if self.stages_used() > budget.stages {
            problems.push(format!(
                "uses {} stages of {}",
                self.stages_used(),
                budget.stages
            ));
        }
        for stage in 0..self.stages_used() {
            let bytes: usize = self
                .registers
                .iter()
                .filter(|r| r.stage == stage)
                .map(RegisterResources::bytes)
                .sum();
            if bytes > budget.register_bytes_per_stage {
                problems.push(format!(
                    "stage {stage} holds {bytes} register bytes of {}",
                    budget.register_bytes_per_stage
                ));
            }
        }
        if self.recomputes_icrc {
            problems.push("recomputes the RoCEv2 ICRC, which a Tofino cannot".into());
        }
        problems
    }
}

impl fmt::Display for ResourceReport {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(formatter, "program {}: {} stages, {} table entries, {} register bytes, up to {} recirculations per packet, ICRC recomputed: {}",
            self.program, self.stages_used(), self.table_entries(), self.register_bytes(),
            self.max_recirculations_per_packet, if self.recomputes_icrc { "yes (not possible on Tofino)" } else { "no" })?;
        for table in &self.tables {
            writeln!(
                formatter,
                "  stage {:>2} table    {:<24} {:?} key {} bits, {}/{} entries",
                table.stage, table.name, table.kind, table.key_bits, table.entries, table.capacity
            )?;
        }
        for register in &self.registers {
            writeln!(
                formatter,
                "  stage {:>2} register {:<24} {} x {} bytes = {} bytes",
                register.stage,
                register.name,
                register.cells,
                register.cell_bytes,
                register.bytes()
            )?;
        }
        if self.control_plane_held_frames > 0 {
            writeln!(
                formatter,
                "  control plane holds up to {} frames for packet-out (through a Tofino's CPU port)",
                self.control_plane_held_frames
            )?;
        }
        for problem in self.over_budget(Budget::TOFINO1) {
            writeln!(formatter, "  against a Tofino 1: {problem}")?;
        }
        Ok(())
    }
}
