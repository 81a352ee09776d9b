//! The flow driven as the glue drives it, over a fake host: one file per part of the flow.

mod answers;
mod count;
mod routes;
mod skip;
pub(crate) mod support;
mod usage;
