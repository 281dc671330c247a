// Renders a QueryResult for `twinstep query` / `compare`: an aligned text table for people, CSV
// and JSON for programs.
#pragma once

#include <ostream>
#include <string>

#include "results/db.h"

namespace twinstep {

enum class OutputFormat { kTable, kCsv, kJson };

// "table", "csv" or "json"; throws Error otherwise.
OutputFormat parse_output_format(const std::string& name);

// Aligned columns with a header and a rule; numbers right-aligned, text left-aligned, NULL as
// "NULL", newline/CR/tab in text shown as \n \r \t. A header wider than its column's cells
// wraps after ", " (bottom-aligned over the rule; CSV and JSON keep it whole). Reals use
// format_table_number(); integers print exactly.
void write_table(const QueryResult& result, std::ostream& out);

// RFC 4180 quoting (a field containing , " CR LF or leading/trailing space is quoted, quotes
// doubled), LF line ends, header row first. NULL is an empty field; reals print exactly
// (shortest round-trip form).
void write_csv(const QueryResult& result, std::ostream& out);

// An array of objects keyed by column name (a repeated name gets "_2", "_3", ...), one per row.
// Integers and reals stay JSON numbers (exact round-trip form); NULL and non-finite reals are
// null; text is escaped.
void write_json(const QueryResult& result, std::ostream& out);

void write_result(const QueryResult& result, OutputFormat format, std::ostream& out);

// Table form of a real: up to 4 decimals with trailing zeros trimmed for |v| >= 1 ("12.3457",
// "3", "1e+15" and up in exponent form), 4 significant digits below 1 ("0.001235", "0").
std::string format_table_number(double v);

}  // namespace twinstep
