#include "sources/document/document_json.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "sources/budget.h"

namespace fragscope::sources {
namespace {

constexpr std::size_t kFlushBytes = std::size_t{1} << 20;

// Appends `s` as a JSON string literal; invalid UTF-8 becomes U+FFFD.
void AppendString(std::string_view s, std::string* out) {
  out->push_back('"');
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"':
          *out += "\\\"";
          break;
        case '\\':
          *out += "\\\\";
          break;
        case '\n':
          *out += "\\n";
          break;
        case '\r':
          *out += "\\r";
          break;
        case '\t':
          *out += "\\t";
          break;
        default:
          if (c < 0x20) {
            *out += fmt::format("\\u{:04x}", c);
          } else {
            out->push_back(static_cast<char>(c));
          }
      }
      ++i;
      continue;
    }
    // Multi-byte sequence: validate lead byte, length, continuation bytes, overlongs,
    // surrogates and the upper bound.
    std::size_t len = 0;
    std::uint32_t cp = 0;
    if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07;
    }
    bool ok = len != 0 && i + len <= s.size();
    for (std::size_t k = 1; ok && k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) ok = false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (ok) {
      ok = (len == 2 && cp >= 0x80) || (len == 3 && cp >= 0x800 && (cp < 0xd800 || cp > 0xdfff)) ||
           (len == 4 && cp >= 0x10000 && cp <= 0x10ffff);
    }
    if (ok) {
      out->append(s.substr(i, len));
      i += len;
    } else {
      *out += "\xef\xbf\xbd";
      ++i;
    }
  }
  out->push_back('"');
}

// Decimal digits of a little-endian two's complement integer of any length.
std::string BigIntDecimal(std::string_view le) {
  std::vector<std::uint8_t> mag(le.begin(), le.end());
  const bool negative = !mag.empty() && (mag.back() & 0x80) != 0;
  if (negative) {  // two's complement -> magnitude
    bool carry = true;
    for (auto& b : mag) {
      b = static_cast<std::uint8_t>(~b);
      if (carry) {
        carry = ++b == 0;
      }
    }
  }
  std::string digits;
  // Repeated division by 10 over base-256 digits (big-endian walk).
  while (true) {
    bool nonzero = false;
    for (const auto b : mag) nonzero |= b != 0;
    if (!nonzero) break;
    std::uint32_t rem = 0;
    for (std::size_t k = mag.size(); k-- > 0;) {
      const std::uint32_t cur = (rem << 8) | mag[k];
      mag[k] = static_cast<std::uint8_t>(cur / 10);
      rem = cur % 10;
    }
    digits.push_back(static_cast<char>('0' + rem));
  }
  if (digits.empty()) digits = "0";
  if (negative) digits.push_back('-');
  return std::string(digits.rbegin(), digits.rend());
}

void AppendScalar(const Document& doc, Value v, std::string* out) {
  switch (v.kind()) {
    case ValueKind::kNone:
      *out += "null";
      break;
    case ValueKind::kBool:
      *out += *doc.AsBool(v) ? "true" : "false";
      break;
    case ValueKind::kInt:
      *out += std::to_string(*doc.AsInt(v));
      break;
    case ValueKind::kBigInt:
      *out += BigIntDecimal(doc.BigIntBytes(v).value_or(""));
      break;
    case ValueKind::kFloat: {
      const double d = *doc.AsDouble(v);
      *out += std::isfinite(d) ? fmt::format("{}", d) : std::string("null");
      break;
    }
    case ValueKind::kString:
      AppendString(*doc.AsString(v), out);
      break;
    case ValueKind::kBytes: {
      *out += R"({"__bytes_hex__":")";
      const std::string_view bytes = doc.AsBytes(v).value_or(std::string_view());
      for (const char c : bytes) *out += fmt::format("{:02x}", static_cast<unsigned char>(c));
      *out += "\"}";
      break;
    }
    default:
      break;
  }
}

bool IsContainer(Value v) {
  return v.kind() == ValueKind::kList || v.kind() == ValueKind::kTuple ||
         v.kind() == ValueKind::kDict;
}

}  // namespace

Status WriteDocumentJson(const Document& doc, const std::function<Status(std::string_view)>& write,
                         const DocumentJsonLimits& limits) {
  struct Frame {
    Value container;
    std::size_t next = 0;
  };
  std::vector<Frame> stack;
  std::string out;
  std::uint64_t written = 0;
  const bool output_user_set =
      limits.max_output_bytes != 0 || ProcessBudget().max_output_bytes != 0;
  const std::uint64_t max_output =
      limits.max_output_bytes != 0 ? limits.max_output_bytes : OutputBudgetFor(doc.input_bytes());
  auto flush = [&](bool force) -> Status {
    if (!force && out.size() < kFlushBytes) return Status::Ok();
    if (out.size() > max_output - std::min(written, max_output)) {
      return Status::LimitExceeded(BudgetMessage(
          "the JSON output outgrew its budget (the file shares objects so often that writing "
          "them out at every reference explodes)",
          "output", max_output, written + out.size(), output_user_set, "--max-output",
          /*bytes=*/true));
    }
    written += out.size();
    FRAGSCOPE_RETURN_IF_ERROR(write(out));
    out.clear();
    return Status::Ok();
  };
  auto open = [&](Value v) -> Status {
    if (stack.size() >= limits.max_depth) {
      return Status::LimitExceeded(fmt::format(
          "nesting deeper than {} (max_depth); a self-referencing object?", limits.max_depth));
    }
    out.push_back(v.kind() == ValueKind::kDict ? '{' : '[');
    stack.push_back(Frame{v, 0});
    return Status::Ok();
  };
  const Value root = doc.root();
  if (!IsContainer(root)) {
    AppendScalar(doc, root, &out);
  } else {
    FRAGSCOPE_RETURN_IF_ERROR(open(root));
  }
  while (!stack.empty()) {
    FRAGSCOPE_RETURN_IF_ERROR(flush(false));
    Frame& f = stack.back();
    const bool is_dict = f.container.kind() == ValueKind::kDict;
    const std::size_t size =
        is_dict ? doc.Entries(f.container).size() : doc.Items(f.container).size();
    if (f.next == size) {
      out.push_back(is_dict ? '}' : ']');
      stack.pop_back();
      continue;
    }
    if (f.next > 0) out.push_back(',');
    Value child;
    if (is_dict) {
      const Document::Entry& e = doc.Entries(f.container)[f.next];
      if (e.first.kind() == ValueKind::kString) {
        AppendString(*doc.AsString(e.first), &out);
      } else {
        std::string key;
        if (IsContainer(e.first)) {
          key = fmt::format("<{}>", ValueKindName(e.first.kind()));
        } else {
          AppendScalar(doc, e.first, &key);
        }
        AppendString(key, &out);
      }
      out.push_back(':');
      child = e.second;
    } else {
      child = doc.Items(f.container)[f.next];
    }
    ++f.next;  // before open(): it may reallocate the stack
    if (IsContainer(child)) {
      FRAGSCOPE_RETURN_IF_ERROR(open(child));
    } else {
      AppendScalar(doc, child, &out);
    }
  }
  out.push_back('\n');
  return flush(true);
}

}  // namespace fragscope::sources
