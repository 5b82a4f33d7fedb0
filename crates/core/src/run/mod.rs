//! The run protocol every plan follows: options and fail points, the run's
//! input, its transaction or lease, the schema drift it may apply, the
//! audits before publish, the report and the ledger row.

pub mod audit;
pub mod input;
pub mod ledger;
pub mod protocol;
pub mod report;
pub mod schema;
pub mod sqlerror;
