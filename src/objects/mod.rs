//! Views of the objects churn-throttler paces (pods, StatefulSets) and the JSON patches
//! it writes to them. Pure: an object in, its view or a patch out.

pub mod pods;
pub mod statefulsets;
