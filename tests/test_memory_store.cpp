// The memory driver, reached only through the URL registry: memory://NAME is one store per
// process and name, read and written like any other.
#include <gtest/gtest.h>

#include <string>

#include "testing/testing.hpp"
#include "zerowait/storage/open.hpp"

namespace zerowait {
namespace {

using testing::as_bytes;

TEST(MemoryStore, OneStorePerNameThroughTheRegistry) {
  auto store = open_store("memory://registry-test");
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  EXPECT_EQ((*store)->describe(), "memory://registry-test");
  ASSERT_TRUE((*store)->make_directory("ds", Deadline::none()).is_ok());
  ASSERT_TRUE((*store)->put("ds/a.bin", as_bytes("hello"), Deadline::none()).is_ok());

  // A second open of the same name sees the same objects; another name is empty.
  auto again = open_store("memory://registry-test");
  ASSERT_TRUE(again.is_ok());
  auto names = (*again)->list("ds", Deadline::none());
  ASSERT_TRUE(names.is_ok()) << names.status().to_string();
  EXPECT_EQ(names.value(), std::vector<std::string>{"a.bin"});
  auto other = open_store("memory://registry-test-other");
  ASSERT_TRUE(other.is_ok());
  EXPECT_FALSE((*other)->exists("ds/a.bin", Deadline::none()).value());

  // The object's bytes through open_source, as a reader given the URL gets them.
  auto source = open_source("memory://registry-test/ds/a.bin", IoBackend::kPread,
                            Deadline::after(std::chrono::seconds(5)));
  ASSERT_TRUE(source.is_ok()) << source.status().to_string();
  EXPECT_EQ((*source)->name(), "memory://registry-test/ds/a.bin");
  std::string text(5, '\0');
  ASSERT_TRUE(
      (*source)->read_at(0, std::as_writable_bytes(std::span(text.data(), text.size()))).is_ok());
  EXPECT_EQ(text, "hello");

  auto missing = open_source("memory://registry-test/ds/none", IoBackend::kPread, Deadline::none());
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound) << missing.status().to_string();
  EXPECT_NE(missing.status().message().find("memory://registry-test/ds/none"), std::string::npos)
      << missing.status().message();
}

TEST(MemoryStore, AURLWithoutANameIsRefused) {
  auto store = open_store("memory://");
  EXPECT_EQ(store.status().code(), ErrorCode::kInvalidArgument) << store.status().to_string();
  EXPECT_NE(store.status().message().find("memory://NAME"), std::string::npos);
}

// The registry's answers come from its table: memory:// is registered but fetched over no
// network (so no cache fronts it), its objects read whole like any other; an unregistered scheme
// is refused rather than sent to some client.
TEST(MemoryStore, IsNotFetchedOverANetworkAndAnUnknownSchemeIsRefused) {
  EXPECT_TRUE(reads_over_network("https://host/ds/manifest.json"));
  EXPECT_TRUE(reads_over_network("HTTP://host/a.tar"));
  EXPECT_TRUE(reads_over_network("S3://bucket/key"));
  EXPECT_FALSE(reads_over_network("memory://registry-test/ds/a.bin"));
  EXPECT_FALSE(reads_over_network("/data/ds/a.zws"));
  EXPECT_FALSE(reads_over_network("ftp://host/a.zws"));

  auto store = open_store("memory://registry-test-whole");
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  ASSERT_TRUE((*store)->make_directory("ds", Deadline::none()).is_ok());
  ASSERT_TRUE((*store)->put("ds/m.json", as_bytes("{}"), Deadline::none()).is_ok());
  auto whole = read_object("memory://registry-test-whole/ds/m.json", Deadline::none());
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  EXPECT_EQ(*whole, "{}");

  const std::string url = "ftp://host/a.zws";
  EXPECT_EQ(require_readable(url, "dataset").code(), ErrorCode::kInvalidArgument);
  auto source = open_source(url, IoBackend::kPread, Deadline::none());
  EXPECT_EQ(source.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(source.status().message().find(url), std::string::npos) << source.status().message();
  auto refused = read_object(url, Deadline::none());
  EXPECT_EQ(refused.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find(url), std::string::npos) << refused.status().message();
}

}  // namespace
}  // namespace zerowait
