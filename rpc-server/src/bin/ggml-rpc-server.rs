//! `ggml-rpc-server`: the same program under upstream's name, for scripts that call the stock
//! tool by name (`cargo install --path rpc-server` installs both).

#![forbid(unsafe_code)]

fn main() {
    rpc_server::app::main()
}
