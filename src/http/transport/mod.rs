//! What every request goes through, whoever sends it: the server
//! (`server`), the connections' bounds (`conn`), the guards in front of
//! Redis (`limits`), bodies (`body`) and the request logs (`logs`).

pub mod body;
pub mod conn;
pub mod limits;
mod logs;
pub mod server;
