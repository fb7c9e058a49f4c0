// A minimal JSON writer for modmoe-bench's results: objects are built from already-serialized
// values, so nesting is just a value that is itself an object or an array.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace modmoe::bench {

inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", ch);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

// Non-finite numbers (a measurement that did not happen) become null.
inline std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}
inline std::string json_number(int64_t v) { return std::to_string(v); }
inline std::string json_bool(bool v) { return v ? "true" : "false"; }

class JsonObject {
 public:
  JsonObject& add(const std::string& key, std::string serialized) {
    fields_.emplace_back(key, std::move(serialized));
    return *this;
  }
  JsonObject& str(const std::string& key, const std::string& v) { return add(key, json_string(v)); }
  JsonObject& num(const std::string& key, double v) { return add(key, json_number(v)); }
  JsonObject& num(const std::string& key, int64_t v) { return add(key, json_number(v)); }
  JsonObject& flag(const std::string& key, bool v) { return add(key, json_bool(v)); }

  std::string dump(int indent = 0) const {
    const std::string pad(indent + 2, ' '), end_pad(indent, ' ');
    std::string s = "{";
    for (size_t i = 0; i < fields_.size(); ++i) {
      s += (i ? ",\n" : "\n") + pad + json_string(fields_[i].first) + ": " + fields_[i].second;
    }
    return s + (fields_.empty() ? "}" : "\n" + end_pad + "}");
  }

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

inline std::string json_array(const std::vector<std::string>& serialized, int indent = 0) {
  const std::string pad(indent + 2, ' '), end_pad(indent, ' ');
  std::string s = "[";
  for (size_t i = 0; i < serialized.size(); ++i) s += (i ? ",\n" : "\n") + pad + serialized[i];
  return s + (serialized.empty() ? "]" : "\n" + end_pad + "]");
}

}  // namespace modmoe::bench
