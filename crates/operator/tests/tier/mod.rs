pub mod apiserver;
pub mod manager;
