//! `ndd`: the networked device driver binary. Everything is in the library
//! ([`ndd::cli::main`]).

fn main() {
    ndd::cli::main()
}
