//! The library half of tandem's command line: what the `engine` binary presents and its tests
//! call directly. [`report`] renders `engine bench` results (markdown, SVG charts) and checks them
//! against their JSON schema.

pub mod report;
