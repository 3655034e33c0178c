//! Audit log files -> disruptive requests in `requestReceivedTimestamp` order: plain or
//! gzip (by magic bytes, several members), stdin as `-`, files merged, bounded reordering.

use super::audit::{read_line, Line, NotDisruptive, Request, Skip};
use crate::limiter::Millis;
use flate2::bufread::MultiGzDecoder;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

/// A line is written when its request completes; a request is received at most this
/// long before: the API server's default request timeout. Requests received earlier than
/// the newest completion minus this are final and leave the reorder buffer.
pub const REORDER_SLACK_MS: Millis = 60_000;
/// Disruptive requests kept for reordering at most, per file (bounds memory whatever the
/// timestamps say); beyond it the oldest leaves early.
pub const REORDER_CAP: usize = 200_000;
/// Line numbers kept per reason for the summary.
pub const FIRST_LINES: usize = 5;

/// What reading produced, besides the requests: every line is in exactly one count.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    pub lines: u64,
    pub bytes: u64,
    /// Disruptive requests handed on (before the pod-level rules of `attribute`).
    pub requests: u64,
    pub not_disruptive: BTreeMap<NotDisruptive, u64>,
    pub skipped: BTreeMap<Skip, u64>,
    /// `file:line` of the first few skipped lines, per reason.
    pub first_skipped: BTreeMap<Skip, Vec<String>>,
    /// Disruptive requests outside --since/--until.
    pub out_of_range: u64,
    /// Requests that left the reorder buffer after a later one had (cap reached).
    pub reordered_late: u64,
    /// `file: truncated after line N` for each cut gzip (or unreadable tail).
    pub truncated: Vec<String>,
}

impl Counts {
    pub fn not_disruptive_total(&self) -> u64 {
        self.not_disruptive.values().sum()
    }
    pub fn skipped_total(&self) -> u64 {
        self.skipped.values().sum()
    }
}

/// The time range kept: requests received in `[since, until)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Range {
    pub since: Option<Millis>,
    pub until: Option<Millis>,
}

impl Range {
    fn keeps(&self, t: Millis) -> bool {
        self.since.is_none_or(|s| t >= s) && self.until.is_none_or(|u| t < u)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct OpenError {
    pub path: String,
    pub source: std::io::Error,
}

struct Source {
    name: String,
    reader: Box<dyn BufRead>,
    line_no: u64,
    done: bool,
    buf: Vec<u8>,
    /// Reorder buffer: (received, sequence) -> request.
    heap: BinaryHeap<Reverse<(Millis, u64, Held)>>,
    newest_stage: Millis,
    seq: u64,
}

/// A request in the reorder buffer; ordered by the heap key only.
#[derive(Debug)]
struct Held(Request);

impl PartialEq for Held {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Held {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

/// Opens `path` (`-`: stdin) and decompresses when it starts with gzip's magic bytes.
pub fn open(path: &Path) -> Result<Box<dyn BufRead>, OpenError> {
    let name = path.display().to_string();
    let raw: Box<dyn Read> = if name == "-" {
        Box::new(std::io::stdin())
    } else {
        Box::new(std::fs::File::open(path).map_err(|source| OpenError {
            path: name.clone(),
            source,
        })?)
    };
    from_reader(raw).map_err(|source| OpenError { path: name, source })
}

/// [`open`] for any reader.
pub fn from_reader(raw: Box<dyn Read>) -> std::io::Result<Box<dyn BufRead>> {
    let mut buffered = BufReader::with_capacity(1 << 18, raw);
    let head = buffered.fill_buf()?;
    if head.starts_with(&[0x1f, 0x8b]) {
        Ok(Box::new(BufReader::with_capacity(
            1 << 18,
            MultiGzDecoder::new(buffered),
        )))
    } else {
        Ok(Box::new(buffered))
    }
}

/// The merged stream of disruptive requests of several files.
pub struct Reader {
    sources: Vec<Source>,
    range: Range,
    pub counts: Counts,
    last_out: Millis,
}

impl Reader {
    pub fn new(inputs: super::Inputs, range: Range) -> Reader {
        Reader {
            sources: inputs
                .into_iter()
                .map(|(name, reader)| Source {
                    name,
                    reader,
                    line_no: 0,
                    done: false,
                    buf: Vec::with_capacity(4096),
                    heap: BinaryHeap::new(),
                    newest_stage: 0,
                    seq: 0,
                })
                .collect(),
            range,
            counts: Counts::default(),
            last_out: 0,
        }
    }

    /// Reads source `i` until its oldest buffered request is final (or the file ends).
    fn fill(&mut self, i: usize) {
        loop {
            let src = &self.sources[i];
            if let Some(Reverse((t, _, _))) = src.heap.peek() {
                if src.done
                    || t + REORDER_SLACK_MS <= src.newest_stage
                    || src.heap.len() > REORDER_CAP
                {
                    return;
                }
            } else if src.done {
                return;
            }
            self.read_one(i);
        }
    }

    fn read_one(&mut self, i: usize) {
        let src = &mut self.sources[i];
        src.buf.clear();
        match src.reader.read_until(b'\n', &mut src.buf) {
            Ok(0) => src.done = true,
            Ok(n) => {
                self.counts.bytes += n as u64;
                // A last line without its newline in a cut file is still read; a cut
                // gzip member shows up as an error below instead.
                src.line_no += 1;
                self.counts.lines += 1;
                let line = src.buf.strip_suffix(b"\n").unwrap_or(&src.buf);
                match read_line(line) {
                    Line::Request(r) => {
                        if !self.range.keeps(r.received) {
                            self.counts.out_of_range += 1;
                            return;
                        }
                        self.counts.requests += 1;
                        src.newest_stage = src.newest_stage.max(r.stage);
                        src.seq += 1;
                        src.heap.push(Reverse((r.received, src.seq, Held(r))));
                    }
                    Line::NotDisruptive(why) => {
                        *self.counts.not_disruptive.entry(why).or_default() += 1;
                    }
                    Line::Skipped(why) => {
                        *self.counts.skipped.entry(why).or_default() += 1;
                        let first = self.counts.first_skipped.entry(why).or_default();
                        if first.len() < FIRST_LINES {
                            first.push(format!("{}:{}", src.name, src.line_no));
                        }
                    }
                }
            }
            Err(e) => {
                // A cut gzip (or a read error): what came before is replayed.
                self.counts.truncated.push(format!(
                    "{}: truncated after line {} ({e})",
                    src.name, src.line_no
                ));
                src.done = true;
            }
        }
    }
}

impl Iterator for Reader {
    type Item = Request;

    fn next(&mut self) -> Option<Request> {
        for i in 0..self.sources.len() {
            self.fill(i);
        }
        let best = self
            .sources
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.heap.peek().map(|Reverse((t, seq, _))| (*t, i, *seq)))
            .min()?;
        let Reverse((t, _, Held(r))) = self.sources[best.1].heap.pop()?;
        if t < self.last_out {
            self.counts.reordered_late += 1;
        }
        self.last_out = self.last_out.max(t);
        Some(r)
    }
}
