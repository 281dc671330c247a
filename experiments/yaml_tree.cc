#include "experiments/yaml_tree.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cstdlib>
#include <set>
#include <sstream>
#include <vector>

#include "policies/error.h"

namespace twinstep::yaml {
namespace {

Mark from_yaml(const YAML::Mark& m) {
  if (m.is_null()) return Mark{};
  return Mark{m.line, m.column};
}

bool looks_boolean(std::string_view s) {
  static const std::set<std::string_view> kWords = {
      "true", "false", "True", "False", "TRUE", "FALSE", "yes", "no", "Yes",
      "No",   "YES",   "NO",   "on",    "off",  "On",    "Off", "ON", "OFF"};
  return kWords.count(s) > 0;
}

bool looks_numeric(const std::string& s) {
  if (s.empty()) return false;
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && !std::isspace(static_cast<unsigned char>(s[0]));
}

bool needs_quotes(const std::string& s) {
  if (s.empty()) return true;
  if (std::isspace(static_cast<unsigned char>(s.front())) ||
      std::isspace(static_cast<unsigned char>(s.back()))) {
    return true;
  }
  for (char c : s) {
    if (c == ',' || c == '[' || c == ']' || c == '{' || c == '}' || c == '#' || c == '"' ||
        c == '\'' || c == '\n' || c == ':') {
      return true;
    }
  }
  return false;
}

Node convert(const YAML::Node& in, const std::string& source) {
  Node out;
  out.mark = from_yaml(in.Mark());
  switch (in.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      out.kind = Node::Kind::kNull;
      break;
    case YAML::NodeType::Scalar:
      out.kind = Node::Kind::kScalar;
      out.scalar = in.Scalar();
      out.quoted = in.Tag() == "!";
      break;
    case YAML::NodeType::Sequence:
      out.kind = Node::Kind::kSequence;
      for (const YAML::Node& item : in) out.items.push_back(convert(item, source));
      break;
    case YAML::NodeType::Map:
      out.kind = Node::Kind::kMapping;
      for (const auto& pair : in) {
        // Copies: yaml-cpp 0.7's iterator proxies die at the end of the full expression.
        const YAML::Node key = pair.first;
        const YAML::Node value = pair.second;
        Mark key_mark = from_yaml(key.Mark());
        if (!key.IsScalar()) {
          throw ConfigError(where(source, key_mark), "a mapping key must be a plain name, not " +
                                                         describe(convert(key, source)));
        }
        if (out.find(key.Scalar()) != nullptr) {
          const Entry* first = out.find(key.Scalar());
          throw ConfigError(where(source, key_mark),
                            "duplicate key '" + key.Scalar() + "' (first at line " +
                                std::to_string(first->key_mark.line + 1) + ")");
        }
        Entry entry{key.Scalar(), key_mark, convert(value, source)};
        // An empty value ("key:" then a newline) is a null whose mark lies on a later token;
        // point at the key instead.
        if (entry.value.is_null() && entry.value.mark.line > key_mark.line) {
          entry.value.mark = key_mark;
        }
        out.entries.push_back(std::move(entry));
      }
      break;
  }
  return out;
}

}  // namespace

std::string where(const std::string& source, Mark mark) {
  if (mark.line < 0) return source;
  return source + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
}

const Entry* Node::find(std::string_view key) const {
  for (const Entry& e : entries) {
    if (e.key == key) return &e;
  }
  return nullptr;
}

Entry* Node::find(std::string_view key) {
  for (Entry& e : entries) {
    if (e.key == key) return &e;
  }
  return nullptr;
}

std::string describe(const Node& node) {
  switch (node.kind) {
    case Node::Kind::kNull:
      return "nothing (null)";
    case Node::Kind::kSequence:
      return "a list";
    case Node::Kind::kMapping:
      return "a mapping";
    case Node::Kind::kScalar:
      break;
  }
  if (node.quoted) return "a quoted string \"" + node.scalar + "\"";
  if (looks_boolean(node.scalar)) return "a boolean '" + node.scalar + "'";
  if (looks_numeric(node.scalar)) return "a number " + node.scalar;
  return "a string '" + node.scalar + "'";
}

std::string to_flow(const Node& node) {
  switch (node.kind) {
    case Node::Kind::kNull:
      return "null";
    case Node::Kind::kScalar: {
      if (!node.quoted && !needs_quotes(node.scalar)) return node.scalar;
      std::string out = "\"";
      for (char c : node.scalar) {
        if (c == '"' || c == '\\') out += '\\';
        if (c == '\n') {
          out += "\\n";
          continue;
        }
        out += c;
      }
      return out + "\"";
    }
    case Node::Kind::kSequence: {
      std::string out = "[";
      for (size_t i = 0; i < node.items.size(); ++i) {
        if (i > 0) out += ", ";
        out += to_flow(node.items[i]);
      }
      return out + "]";
    }
    case Node::Kind::kMapping: {
      std::string out = "{";
      for (size_t i = 0; i < node.entries.size(); ++i) {
        if (i > 0) out += ", ";
        out += node.entries[i].key + ": " + to_flow(node.entries[i].value);
      }
      return out + "}";
    }
  }
  return "";
}

namespace {

// Sees only where each document starts.
class DocumentStarts : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> starts;
  void OnDocumentStart(const YAML::Mark& mark) override { starts.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// yaml-cpp 0.7's LoadAll loops forever, allocating a null document per turn, on a token it
// cannot start a node with, e.g. a lone ',' (jbeder/yaml-cpp#1040, fixed upstream by #1319;
// found here by fuzz/fuzz_experiment). Walks the documents first and throws at the first one
// that starts where the previous one did, so LoadAll is called only on input it finishes.
void check_documents_progress(const std::string& text, const std::string& source) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentStarts docs;
  while (parser.HandleNextDocument(docs)) {
    const size_t n = docs.starts.size();
    if (n >= 2 && docs.starts[n - 1].pos == docs.starts[n - 2].pos) {
      const YAML::Mark& m = docs.starts[n - 1];
      const size_t pos = static_cast<size_t>(m.pos);
      const std::string token = pos < text.size() ? std::string(1, text[pos]) : "end of file";
      throw ConfigError(where(source, from_yaml(m)),
                        "malformed YAML: unexpected '" + token + "' (a node cannot start here)");
    }
  }
}

}  // namespace

Node parse_document(const std::string& text, const std::string& source) {
  std::vector<YAML::Node> docs;
  try {
    check_documents_progress(text, source);
    docs = YAML::LoadAll(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(where(source, from_yaml(e.mark)), "malformed YAML: " + e.msg);
  }
  if (docs.empty() || (docs.size() == 1 && docs[0].IsNull())) {
    throw ConfigError(where(source, Mark{0, 0}), "the experiment is empty (no YAML content)");
  }
  if (docs.size() > 1) {
    throw ConfigError(where(source, from_yaml(docs[1].Mark())),
                      "expected one YAML document, found " + std::to_string(docs.size()) +
                          " (remove the '---' separators)");
  }
  return convert(docs[0], source);
}

}  // namespace twinstep::yaml
