//! `rpc-server`: see [`rpc_server::app`].

#![forbid(unsafe_code)]

fn main() {
    rpc_server::app::main()
}
