// Drawing through gnuplot (Debian package gnuplot-nox): figures are a gnuplot script plus data
// files written to a work directory, rendered to PNG by the gnuplot binary.
#pragma once

#include <string>
#include <string_view>

namespace twinstep {

// The gnuplot executable ($TWINSTEP_GNUPLOT, else `gnuplot` on PATH). Throws Error
// ("gnuplot not found: install gnuplot-nox") when there is none.
std::string find_gnuplot();

// A `set terminal ...` line for a PNG of width × height pixels: pngcairo when this gnuplot
// has it (antialiased), else the libgd png terminal. Fonts are DejaVu Sans at a readable size.
std::string png_terminal(const std::string& gnuplot, int width_px, int height_px);

// Runs gnuplot on `script_path`. Throws Error carrying gnuplot's messages on failure.
void run_gnuplot(const std::string& gnuplot, const std::string& script_path);

// `text` as a gnuplot single-quoted string literal (no escape processing; ' doubled).
std::string gp_quote(std::string_view text);

}  // namespace twinstep
