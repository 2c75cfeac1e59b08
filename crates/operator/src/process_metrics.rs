//! The `process_*` metrics every Prometheus client library exports (CPU seconds, resident and
//! virtual memory, open and maximum file descriptors, threads), read from `/proc/self` with the
//! `procfs` crate at each scrape. Unprefixed, as dashboards and alerts written for any process
//! expect them. On a system without `/proc` (or when it cannot be read) they are left out of the
//! scrape rather than reported as zero.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// The collector (see the module docs).
#[derive(Debug, Default)]
pub struct ProcessCollector;

/// One reading of the process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessReading {
    /// User + system CPU time.
    pub cpu_seconds: f64,
    /// Resident set size.
    pub resident_bytes: u64,
    /// Virtual memory size.
    pub virtual_bytes: u64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// The soft limit on open file descriptors (`None` when unlimited).
    pub max_fds: Option<u64>,
    /// Threads.
    pub threads: u64,
}

/// Reads this process from `/proc/self`.
#[cfg(target_os = "linux")]
pub fn read() -> Option<ProcessReading> {
    use procfs::process::{LimitValue, Process};
    let me = Process::myself().ok()?;
    let stat = me.stat().ok()?;
    let ticks = procfs::ticks_per_second();
    let page = procfs::page_size();
    let limits = me.limits().ok()?;
    Some(ProcessReading {
        // Tick counts are far below 2^53, so the conversion is exact.
        #[allow(clippy::cast_precision_loss)]
        cpu_seconds: (stat.utime + stat.stime) as f64 / ticks as f64,
        resident_bytes: stat.rss.saturating_mul(page),
        virtual_bytes: stat.vsize,
        open_fds: u64::try_from(me.fd_count().ok()?).unwrap_or(u64::MAX),
        max_fds: match limits.max_open_files.soft_limit {
            LimitValue::Value(v) => Some(v),
            LimitValue::Unlimited => None,
        },
        threads: u64::try_from(stat.num_threads).unwrap_or(0),
    })
}

/// Reads this process: nothing to read without `/proc`.
#[cfg(not(target_os = "linux"))]
pub fn read() -> Option<ProcessReading> {
    None
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), std::fmt::Error> {
    let value = i64::try_from(value).unwrap_or(i64::MAX);
    ConstGauge::new(value).encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(r) = read() else {
            return Ok(());
        };
        ConstCounter::new(r.cpu_seconds).encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            MetricType::Counter,
        )?)?;
        gauge(
            &mut encoder,
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            r.resident_bytes,
        )?;
        gauge(
            &mut encoder,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes",
            r.virtual_bytes,
        )?;
        gauge(
            &mut encoder,
            "process_open_fds",
            "Number of open file descriptors",
            r.open_fds,
        )?;
        if let Some(max) = r.max_fds {
            gauge(
                &mut encoder,
                "process_max_fds",
                "Maximum number of open file descriptors",
                max,
            )?;
        }
        gauge(
            &mut encoder,
            "process_threads",
            "Number of OS threads",
            r.threads,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::registry::Registry;

    use super::*;

    #[test]
    fn the_process_metrics_read_this_process() {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ProcessCollector));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        if cfg!(target_os = "linux") {
            let value = |name: &str| -> f64 {
                text.lines()
                    .find(|l| l.starts_with(&format!("{name} ")))
                    .and_then(|l| l.rsplit(' ').next())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
            };
            assert!(value("process_resident_memory_bytes") > 1e6, "{text}");
            assert!(
                value("process_virtual_memory_bytes") >= value("process_resident_memory_bytes")
            );
            assert!(value("process_open_fds") >= 3.0, "{text}");
            assert!(value("process_threads") >= 1.0, "{text}");
            assert!(value("process_cpu_seconds_total") >= 0.0, "{text}");
            assert!(
                text.contains("# TYPE process_cpu_seconds counter"),
                "{text}"
            );
        }
    }
}
