//! The packet generator: templates injected into the pipeline
//! periodically, as Tofino's packet generator does. Each template has a
//! priority; priority 0 is background traffic that leaves a port only when
//! nothing else waits there (Cowbird's probes run at the lowest priority).

use remora_base::Timestamp;
use std::time::Duration;

/// The most templates one switch runs.
pub const MAX_TEMPLATES: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pub bytes: Vec<u8>,
    pub period: Duration,
    pub priority: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TemplateId(pub usize);

#[derive(Debug, Default)]
pub struct PacketGenerator {
    templates: Vec<(Template, Timestamp)>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GeneratorError {
    #[error("the generator holds at most {MAX_TEMPLATES} templates")]
    Full,
    #[error("a template's period must be positive")]
    ZeroPeriod,
    #[error("no template {0}")]
    UnknownTemplate(usize),
}

impl PacketGenerator {
    /// Adds a template whose first packet is due at `first`.
    pub fn add(
        &mut self,
        template: Template,
        first: Timestamp,
    ) -> Result<TemplateId, GeneratorError> {
        if template.period.is_zero() {
            return Err(GeneratorError::ZeroPeriod);
        }
        if self.templates.len() >= MAX_TEMPLATES {
            return Err(GeneratorError::Full);
        }
        self.templates.push((template, first));
        Ok(TemplateId(self.templates.len() - 1))
    }

    /// Changes a template's period, as a control plane ramps probing up or
    /// down. A shorter period brings the next packet forward by as much
    /// (its due time kept, a ramp from 1 s to 10 µs waited up to a second
    /// for the first fast probe); a longer one takes effect after it.
    pub fn set_period(&mut self, id: TemplateId, period: Duration) -> Result<(), GeneratorError> {
        if period.is_zero() {
            return Err(GeneratorError::ZeroPeriod);
        }
        let (template, due) = self
            .templates
            .get_mut(id.0)
            .ok_or(GeneratorError::UnknownTemplate(id.0))?;
        if let Some(sooner) = template.period.checked_sub(period) {
            let nanos = due.as_nanos().saturating_sub(sooner.as_nanos() as u64);
            *due = Timestamp::from_nanos(nanos);
        }
        template.period = period;
        Ok(())
    }

    pub fn next_due(&self) -> Option<Timestamp> {
        self.templates.iter().map(|(_, due)| *due).min()
    }

    /// Calls `emit` for every template due by `now`, highest priority
    /// first, and schedules each at the first time on its grid (its due
    /// time plus whole periods) after `now`. A template that fell several
    /// periods behind fires once, not in a burst; scheduled a period
    /// after `now`, every late call moved the grid later, and a rack's
    /// late pumps slowed the probe rate.
    pub fn fire_due(&mut self, now: Timestamp, emit: &mut dyn FnMut(&Template)) {
        let mut due: Vec<usize> = (0..self.templates.len())
            .filter(|index| self.templates[*index].1 <= now)
            .collect();
        due.sort_by_key(|index| std::cmp::Reverse(self.templates[*index].0.priority));
        for index in due {
            let (template, next) = &mut self.templates[index];
            emit(template);
            let period_ns = template.period.as_nanos().clamp(1, u128::from(u64::MAX)) as u64;
            let periods = (now.as_nanos() - next.as_nanos()) / period_ns + 1;
            let ahead_ns = periods.saturating_mul(period_ns);
            *next = Timestamp::from_nanos(next.as_nanos().saturating_add(ahead_ns));
        }
    }
}
