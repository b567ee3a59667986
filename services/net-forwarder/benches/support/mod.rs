//! What the network benchmark builds on: processes and namespaces ([`ns`]), bubbles and pods
//! ([`bubble`]), the measurements ([`measure`]) and the table ([`report`]).

#![allow(dead_code)]

pub mod bubble;
pub mod measure;
pub mod ns;
pub mod report;
