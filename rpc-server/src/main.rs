//! `rpc-server`: see [`rpc_server::app`].

fn main() {
    rpc_server::app::main()
}
