//! Latency samples: percentiles and a log-spaced histogram.

use std::time::Duration;

use crate::links::fmt_dur;

/// Summary of a set of latency samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// Smallest sample.
    pub min: Duration,
    /// Median (nearest rank).
    pub p50: Duration,
    /// 90th percentile (nearest rank).
    pub p90: Duration,
    /// 99th percentile (nearest rank).
    pub p99: Duration,
    /// Largest sample.
    pub max: Duration,
    /// Arithmetic mean.
    pub mean: Duration,
    /// Histogram: (upper bucket edge, count); the last edge is `Duration::MAX`.
    pub histogram: Vec<(Duration, usize)>,
}

/// Upper edges of the histogram buckets: 1-2-5 steps from 1 µs to 10 s.
pub fn bucket_edges() -> Vec<Duration> {
    let mut v = Vec::new();
    let mut decade = 1u64; // µs
    while decade <= 1_000_000 {
        for m in [1u64, 2, 5] {
            v.push(Duration::from_micros(decade * m));
        }
        decade *= 10;
    }
    v.push(Duration::from_secs(10));
    v.push(Duration::MAX);
    v
}

/// Nearest-rank percentile of sorted samples (`q` in 0..=1).
fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Summary {
    /// Summarises samples (any order). Empty input gives zeros.
    pub fn of(samples: &[Duration]) -> Summary {
        let mut s = samples.to_vec();
        s.sort_unstable();
        let n = s.len();
        let total: Duration = s.iter().sum();
        let mean = if n == 0 {
            Duration::ZERO
        } else {
            total / n as u32
        };
        let edges = bucket_edges();
        let mut histogram: Vec<(Duration, usize)> = edges.iter().map(|&e| (e, 0)).collect();
        for x in &s {
            let i = edges.iter().position(|e| x < e).unwrap_or(edges.len() - 1);
            histogram[i].1 += 1;
        }
        Summary {
            n,
            min: s.first().copied().unwrap_or_default(),
            p50: percentile(&s, 0.50),
            p90: percentile(&s, 0.90),
            p99: percentile(&s, 0.99),
            max: s.last().copied().unwrap_or_default(),
            mean,
            histogram,
        }
    }

    /// The non-empty part of the histogram as text lines: `  20-50 us   ####### 123`.
    pub fn histogram_lines(&self, width: usize) -> Vec<String> {
        let first = self.histogram.iter().position(|b| b.1 > 0);
        let last = self.histogram.iter().rposition(|b| b.1 > 0);
        let (Some(first), Some(last)) = (first, last) else {
            return Vec::new();
        };
        let peak = self.histogram.iter().map(|b| b.1).max().unwrap_or(1).max(1);
        (first..=last)
            .map(|i| {
                let lo = if i == 0 {
                    Duration::ZERO
                } else {
                    self.histogram[i - 1].0
                };
                let (hi, n) = self.histogram[i];
                let label = if hi == Duration::MAX {
                    format!(">= {}", fmt_dur(lo))
                } else {
                    format!("< {}", fmt_dur(hi))
                };
                let bar = "#".repeat((n * width).div_ceil(peak));
                format!("{label:>12} {bar:<width$} {n}")
            })
            .collect()
    }

    /// Compact histogram for CSV cells: `<20us:3;<50us:120;...`.
    pub fn histogram_compact(&self) -> String {
        self.histogram
            .iter()
            .filter(|b| b.1 > 0)
            .map(|(e, n)| {
                if *e == Duration::MAX {
                    format!(">=10s:{n}")
                } else {
                    format!("<{}us:{n}", e.as_micros())
                }
            })
            .collect::<Vec<_>>()
            .join(";")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_buckets() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        let s = Summary::of(&v);
        assert_eq!(s.n, 100);
        assert_eq!(s.p50, Duration::from_micros(50));
        assert_eq!(s.p99, Duration::from_micros(99));
        assert_eq!(s.min, Duration::from_micros(1));
        assert_eq!(s.max, Duration::from_micros(100));
        assert_eq!(s.histogram.iter().map(|b| b.1).sum::<usize>(), 100);
        assert!(s.histogram_compact().starts_with("<2us:1;<5us:3;"));
        assert!(!s.histogram_lines(20).is_empty());
        assert_eq!(Summary::of(&[]).p50, Duration::ZERO);
    }
}
