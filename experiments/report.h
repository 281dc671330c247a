// `twinstep report`: one self-contained HTML file per experiment — the compare tables and every
// figure embedded as a base64 data: URI, so it opens offline and can be mailed as one file.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "experiments/plot.h"
#include "results/db.h"

namespace twinstep {

// Writes the report for `run_ids` (runs of experiment `experiment_name`) with `figures` from
// plot_runs. An inline script counts the images that decoded (naturalWidth > 0) into
// <p id="image-check" data-loaded=N data-total=M> once the page has loaded, for headless
// checks. Throws Error if a figure's PNG cannot be read.
void write_report(ResultsDb& db, const std::string& experiment_name,
                  const std::vector<int64_t>& run_ids, const std::vector<Figure>& figures,
                  std::ostream& out);

// RFC 4648 base64 with padding.
std::string base64_encode(std::string_view bytes);

// `text` with & < > " ' escaped for HTML.
std::string html_escape(std::string_view text);

}  // namespace twinstep
