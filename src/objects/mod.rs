//! Views of the objects churn-throttler paces (pods, StatefulSets) and reads (Nodes,
//! PacingOverrides), and
//! the JSON patches it writes to them. Pure: an object in, its view or a patch out.

pub mod nodes;
pub mod overrides;
pub mod pods;
pub mod statefulsets;
