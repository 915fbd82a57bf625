//! The transport flags every binary shares (rpc-server, rpc-shim, rpc-bench): the `--transport`
//! modes, the `--rdma-flavor` choice and the RDMA device flags, as clap `Args` structs each
//! binary flattens (`#[command(flatten)]`).

use crate::rdma::real::RdmaOptions;
use crate::rdma::Flavor;

/// `--transport`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportMode {
    /// RDMA when both ends can (negotiated inside HELLO, per connection), else TCP.
    Auto,
    /// Never RDMA (a server answers zero caps, a client offers none).
    Tcp,
    /// RDMA required: a server refuses to start without a usable RDMA device, a client refuses a
    /// connection on which RDMA does not engage.
    Rdma,
}

/// `--rdma-flavor`: the caps layout and framing a client offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FlavorChoice {
    /// The platform's own ([`Flavor::native`]): Apple UC on macOS, Linux RC elsewhere (what a
    /// stock client offers).
    Native,
    /// Upstream's Linux flavor (`transport.cpp`: RoCE / InfiniBand, RC queue pair).
    Rc,
    /// Upstream's Apple flavor (`transport-apple.cpp`: Thunderbolt, UC queue pair).
    Uc,
}

impl FlavorChoice {
    /// The flavor this choice stands for on this platform.
    pub fn flavor(self) -> Flavor {
        match self {
            FlavorChoice::Native => Flavor::native(),
            FlavorChoice::Rc => Flavor::LinuxRc,
            FlavorChoice::Uc => Flavor::AppleUc,
        }
    }
}

/// The RDMA device flags (server and clients).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RdmaArgs {
    /// Only use this RDMA device (e.g. `rxe0`, `mlx5_0`, `rdma_en2`; also GGML_RDMA_DEV).
    #[arg(long, value_name = "NAME")]
    pub rdma_device: Option<String>,

    /// Use this GID table index instead of matching the connection's local address (also
    /// GGML_RDMA_GID).
    #[arg(long, value_name = "INDEX")]
    pub rdma_gid_index: Option<u32>,
}

impl RdmaArgs {
    /// Device and GID selection: the flags, else upstream's environment variables.
    pub fn options(&self) -> RdmaOptions {
        RdmaOptions {
            device: self.rdma_device.clone().or_else(|| {
                std::env::var("GGML_RDMA_DEV")
                    .ok()
                    .filter(|s| !s.is_empty())
            }),
            gid_index: self.rdma_gid_index.or_else(|| {
                std::env::var("GGML_RDMA_GID")
                    .ok()
                    .and_then(|s| s.parse().ok())
            }),
        }
    }
}

/// The RDMA flags of a client (rpc-shim, rpc-bench): the device flags and the flavor offered.
#[derive(Debug, Clone, clap::Args)]
pub struct RdmaClientArgs {
    #[command(flatten)]
    pub rdma: RdmaArgs,

    /// RDMA flavor offered: `native` is what a stock client of this platform offers (Apple UC on
    /// macOS, Linux RC elsewhere).
    #[arg(long, value_enum, default_value = "native")]
    pub rdma_flavor: FlavorChoice,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        rdma: RdmaClientArgs,
    }

    #[test]
    fn flags_parse() {
        let c = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(c.rdma.rdma_flavor, FlavorChoice::Native);
        assert_eq!(c.rdma.rdma_flavor.flavor(), Flavor::native());
        let c = Cli::try_parse_from([
            "x",
            "--rdma-flavor",
            "uc",
            "--rdma-device",
            "rxe0",
            "--rdma-gid-index",
            "3",
        ])
        .unwrap();
        assert_eq!(c.rdma.rdma_flavor.flavor(), Flavor::AppleUc);
        assert_eq!(c.rdma.rdma.rdma_device.as_deref(), Some("rxe0"));
        assert_eq!(c.rdma.rdma.rdma_gid_index, Some(3));
    }
}
