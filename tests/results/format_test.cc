#include "results/format.h"

#include <gtest/gtest.h>

#include <sstream>

#include "policies/error.h"

namespace twinstep {
namespace {

QueryResult sample() {
  QueryResult r;
  r.columns = {"key", "value", "n", "note"};
  r.rows = {{std::string("tpot_ms_mean"), 12.345678, int64_t{3}, std::string("plain")},
            {std::string("x"), 0.000123456, int64_t{-42}, Cell()},
            {std::string("big"), 2.0, int64_t{1000}, std::string("a,b \"q\"\nline")}};
  return r;
}

template <typename F>
std::string render(const QueryResult& r, F f) {
  std::ostringstream out;
  f(r, out);
  return out.str();
}

TEST(Format, TableNumbers) {
  EXPECT_EQ(format_table_number(12.345678), "12.3457");
  EXPECT_EQ(format_table_number(2.0), "2");
  EXPECT_EQ(format_table_number(-1.5), "-1.5");
  EXPECT_EQ(format_table_number(0), "0");
  EXPECT_EQ(format_table_number(0.000123456), "0.0001235");
  EXPECT_EQ(format_table_number(0.5), "0.5");
  EXPECT_EQ(format_table_number(1234567.0), "1234567");
  EXPECT_EQ(format_table_number(1e20), "1e+20");
  EXPECT_EQ(format_table_number(-0.00004), "-4e-05");
}

TEST(Format, TableAlignsNumbersRight) {
  const std::string expected =
      "key           value      n     note\n"
      "------------  ---------  ----  -------------\n"
      "tpot_ms_mean    12.3457     3  plain\n"
      "x             0.0001235   -42  NULL\n"
      "big                   2  1000  a,b \"q\"\\nline\n";
  EXPECT_EQ(render(sample(), write_table), expected);
}

// compare's columns: a variant label over numbers wraps after its ", " separators, packed up to
// the widest piece; a header no wider than its cells, or without ", ", stays on one line.
TEST(Format, TableWrapsHeadersWiderThanTheirCells) {
  QueryResult r;
  r.columns = {"metric", "a.host=lockstep, a.sync=false, b=1 [sim]", "x, y", "no_separator_here"};
  r.rows = {{std::string("tpot_ms_mean"), 5.4735, std::string("long cell"), int64_t{7}},
            {std::string("gpu_busy_frac"), 0.836, Cell(), int64_t{12}}};
  // Pieces "a.host=lockstep," (16), "a.sync=false," (13), "b=1 [sim]" (9): no two fit in 16.
  EXPECT_EQ(render(r, write_table),
            "               a.host=lockstep,\n"
            "               a.sync=false,\n"
            "metric         b=1 [sim]         x, y       no_separator_here\n"
            "-------------  ----------------  ---------  -----------------\n"
            "tpot_ms_mean             5.4735  long cell                  7\n"
            "gpu_busy_frac             0.836  NULL                      12\n");
  // CSV keeps the header whole.
  const std::string csv = render(r, write_csv);
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "metric,\"a.host=lockstep, a.sync=false, b=1 [sim]\",\"x, y\",no_separator_here");
}

TEST(Format, TableCountsUtf8CodePoints) {
  QueryResult r;
  r.columns = {"name", "v"};
  r.rows = {{std::string("µs"), int64_t{1}}, {std::string("abc"), int64_t{22}}};
  EXPECT_EQ(render(r, write_table),
            "name  v\n"
            "----  --\n"
            "µs     1\n"
            "abc   22\n");
}

TEST(Format, CsvQuotesPerRfc4180) {
  const std::string expected =
      "key,value,n,note\n"
      "tpot_ms_mean,12.345678,3,plain\n"
      "x,0.000123456,-42,\n"
      "big,2,1000,\"a,b \"\"q\"\"\nline\"\n";
  EXPECT_EQ(render(sample(), write_csv), expected);
  QueryResult r;
  r.columns = {"a,b", " lead", "cr"};
  r.rows = {{std::string(" x"), std::string("y "), std::string("1\r2")}};
  EXPECT_EQ(render(r, write_csv), "\"a,b\",\" lead\",cr\n\" x\",\"y \",\"1\r2\"\n");
}

TEST(Format, CsvRealsRoundTrip) {
  QueryResult r;
  r.columns = {"v"};
  r.rows = {{0.1}, {1.0 / 3}, {1e300}};
  EXPECT_EQ(render(r, write_csv), "v\n0.1\n0.3333333333333333\n1e+300\n");
}

TEST(Format, JsonKeepsTypes) {
  const std::string expected =
      "[\n"
      " {\"key\": \"tpot_ms_mean\", \"value\": 12.345678, \"n\": 3, \"note\": \"plain\"},\n"
      " {\"key\": \"x\", \"value\": 0.000123456, \"n\": -42, \"note\": null},\n"
      " {\"key\": \"big\", \"value\": 2, \"n\": 1000, \"note\": \"a,b \\\"q\\\"\\nline\"}\n"
      "]\n";
  EXPECT_EQ(render(sample(), write_json), expected);
}

TEST(Format, JsonEscapesAndEdgeCases) {
  QueryResult r;
  r.columns = {"id", "id", "s"};
  r.rows = {{int64_t{1}, std::numeric_limits<double>::quiet_NaN(),
             std::string("tab\there\\ \x01 \xc2\xb5")}};
  EXPECT_EQ(render(r, write_json),
            "[\n {\"id\": 1, \"id_2\": null, \"s\": \"tab\\there\\\\ \\u0001 \xc2\xb5\"}\n]\n");
  QueryResult empty;
  empty.columns = {"a"};
  EXPECT_EQ(render(empty, write_json), "[]\n");
}

TEST(Format, ParseOutputFormat) {
  EXPECT_EQ(parse_output_format("table"), OutputFormat::kTable);
  EXPECT_EQ(parse_output_format("csv"), OutputFormat::kCsv);
  EXPECT_EQ(parse_output_format("json"), OutputFormat::kJson);
  EXPECT_THROW(parse_output_format("xml"), Error);
  std::ostringstream out;
  write_result(sample(), OutputFormat::kCsv, out);
  EXPECT_EQ(out.str().substr(0, 17), "key,value,n,note\n");
}

}  // namespace
}  // namespace twinstep
