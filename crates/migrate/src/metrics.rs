//! What every migration method reports (paper 003 §III-A; Hines et al.): one [`Metrics`] per
//! migration, with times in nanoseconds from the migration's start (the freeze request).

/// The metrics of one migration.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metrics {
    /// Method name (`fam`, `socket`, `stop-and-copy`, `pre-copy`).
    pub method: String,
    /// Freeze requested → the application runs at the target.
    pub downtime_ns: u64,
    /// The application runs at the target → every page is present there.
    pub resume_ns: u64,
    /// Start → the source may exit (its last duty done).
    pub busy_ns: u64,
    /// Start → every page is present at the target (= downtime + resume).
    pub total_ns: u64,
    /// Faults the target resolved by asking the source.
    pub pages_on_demand: u64,
    /// Faults the target resolved from FAM with no message.
    pub faults_from_fam: u64,
    /// Pages the source pushed without being asked (expiration, pre-copy rounds).
    pub pages_pushed: u64,
    /// Bytes of region data moved.
    pub bytes: u64,
    /// Before the start, with the application still running at the source: reserving the
    /// medium and the target's memory (FAM files populated, target memory populated). Not
    /// part of any of the times above; 0 where the method reserves nothing.
    pub reserve_ns: u64,
}
