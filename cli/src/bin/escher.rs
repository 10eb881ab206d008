//! The `escher` command-line tool; everything is in [`escher_cli`].

fn main() -> std::process::ExitCode {
    escher_cli::main()
}
