//! The `escher` command-line tool; everything is in [`escher_client::cli`].

fn main() -> std::process::ExitCode {
    escher_client::cli::main()
}
